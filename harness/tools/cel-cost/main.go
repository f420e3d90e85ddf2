// Command cel-cost times admission policies the way kube-apiserver evaluates them, in one
// process and without an apiserver: for a MutatingAdmissionPolicy its CEL variables and
// JSONPatch expression plus applying the patch to the pod (k8s.io/apiserver's own
// patch.Patcher), for a ValidatingAdmissionPolicy its matchConditions, variables and
// validations (validating.Validator). Each file is run in batches, the batches of all files
// interleaved, and the best batch reported: a steadier per-pod figure than pod creates
// through a real apiserver on a shared machine (bench/cel_cost.py drives it).
//
//	cel-cost -pod POD.json -mutated MUTATED.json [-m MAP.yaml]... [-v VAP.yaml]... [-cpuprofile FILE] [-memprofile FILE]
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apiserver/pkg/admission"
	plugincel "k8s.io/apiserver/pkg/admission/plugin/cel"
	"k8s.io/apiserver/pkg/admission/plugin/policy/mutating/patch"
	"k8s.io/apiserver/pkg/admission/plugin/policy/validating"
	"k8s.io/apiserver/pkg/admission/plugin/webhook/matchconditions"
	celconfig "k8s.io/apiserver/pkg/apis/cel"
	"k8s.io/apiserver/pkg/authentication/user"
	"k8s.io/apiserver/pkg/cel/environment"
	"k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/yaml"
)

type files []string

func (f *files) String() string     { return strings.Join(*f, ",") }
func (f *files) Set(v string) error { *f = append(*f, v); return nil }

var (
	gvk = schema.GroupVersionKind{Version: "v1", Kind: "Pod"}
	gvr = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	ns  = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "bench"}}
	o   = admission.NewObjectInterfacesFromScheme(scheme.Scheme)
)

func fail(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "cel-cost:", err)
		os.Exit(1)
	}
}

// load reads a YAML or JSON file into a new T.
func load[T any](path string) *T {
	data, err := os.ReadFile(path)
	fail(err)
	var value T
	fail(yaml.Unmarshal(data, &value))
	return &value
}

func readPod(path string) *corev1.Pod {
	pod := load[corev1.Pod](path)
	pod.Namespace = "bench"
	return pod
}

func attributes(pod *corev1.Pod) *admission.VersionedAttributes {
	obj := pod.DeepCopy()
	attrs := admission.NewAttributesRecord(obj, nil, gvk, "bench", obj.Name, gvr, "", admission.Create,
		&metav1.CreateOptions{}, false, &user.DefaultInfo{Name: "bench"})
	versioned, err := admission.NewVersionedAttributes(attrs, gvk, o)
	fail(err)
	return versioned
}

func compiler(variables []admissionregistrationv1.Variable) *plugincel.CompositedCompiler {
	c, err := plugincel.NewCompositedCompiler(environment.MustBaseEnvSet(environment.DefaultCompatibilityVersion()))
	fail(err)
	accessors := make([]plugincel.NamedExpressionAccessor, len(variables))
	for i, v := range variables {
		accessors[i] = &validating.Variable{Name: v.Name, Expression: v.Expression}
	}
	c.CompileAndStoreVariables(accessors, options, environment.StoredExpressions)
	return c
}

var options = plugincel.OptionalVariableDeclarations{HasAuthorizer: true}

func matcher(c *plugincel.CompositedCompiler, conditions []admissionregistrationv1.MatchCondition, name string) matchconditions.Matcher {
	if len(conditions) == 0 {
		return nil
	}
	accessors := make([]plugincel.ExpressionAccessor, len(conditions))
	for i := range conditions {
		accessors[i] = (*matchconditions.MatchCondition)(&conditions[i])
	}
	fail := admissionregistrationv1.Fail
	return matchconditions.NewMatcher(c.CompileCondition(accessors, options, environment.StoredExpressions), &fail, "policy", "validate", name)
}

// mutating: one admission of pod by the policy in path (match, variables, patch, apply).
func mutating(path string, pod *corev1.Pod, show bool) func() {
	policy := load[admissionregistrationv1.MutatingAdmissionPolicy](path)
	c := compiler(policy.Spec.Variables)
	match := matcher(c, policy.Spec.MatchConditions, policy.Name)
	patchOptions := options
	patchOptions.HasPatchTypes = true
	var patchers []patch.Patcher
	for _, m := range policy.Spec.Mutations {
		if m.JSONPatch == nil {
			fail(fmt.Errorf("%s: only JSONPatch mutations are timed", path))
		}
		evaluator := c.CompileMutatingEvaluator(&patch.JSONPatchCondition{Expression: m.JSONPatch.Expression}, patchOptions, environment.StoredExpressions)
		if errs := evaluator.CompilationErrors(); len(errs) > 0 {
			fail(fmt.Errorf("%s: %v", path, errs))
		}
		patchers = append(patchers, patch.NewJSONPatcher(evaluator))
	}
	return func() {
		ctx := c.CreateContext(context.Background())
		versioned := attributes(pod)
		if match != nil {
			if result := match.Match(ctx, versioned, nil, nil); result.Error != nil || !result.Matches {
				fail(fmt.Errorf("%s does not match the pod (%v)", path, result.Error))
			}
		}
		for _, p := range patchers {
			out, err := p.Patch(ctx, patch.Request{MatchedResource: gvr, VersionedAttributes: versioned,
				ObjectInterfaces: o, Namespace: ns}, celconfig.RuntimeCELCostBudget)
			fail(err)
			versioned.UpdateObject(out)
		}
		if show {
			text, _ := json.Marshal(versioned.VersionedObject.Object())
			fmt.Println(string(text))
		}
	}
}

// validating: one admission of pod by the policy in path (match, variables, validations).
func validatingPolicy(path string, pod *corev1.Pod, show bool) func() {
	policy := load[admissionregistrationv1.ValidatingAdmissionPolicy](path)
	c := compiler(policy.Spec.Variables)
	checks := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	messages := make([]plugincel.ExpressionAccessor, len(policy.Spec.Validations))
	for i, v := range policy.Spec.Validations {
		checks[i] = &validating.ValidationCondition{Expression: v.Expression, Message: v.Message, Reason: v.Reason}
		messages[i] = &validating.MessageExpressionCondition{MessageExpression: v.MessageExpression}
	}
	validator := validating.NewValidator(c.CompileCondition(checks, options, environment.StoredExpressions),
		matcher(c, policy.Spec.MatchConditions, policy.Name),
		c.CompileCondition(nil, options, environment.StoredExpressions),
		c.CompileCondition(messages, plugincel.OptionalVariableDeclarations{}, environment.StoredExpressions),
		policy.Spec.FailurePolicy, nil)
	return func() {
		ctx := c.CreateContext(context.Background())
		result := validator.Validate(ctx, gvr, attributes(pod), nil, ns, celconfig.RuntimeCELCostBudget, nil)
		for _, decision := range result.Decisions {
			if decision.Action != validating.ActionAdmit || show {
				fmt.Printf("%s: %s %s\n", path, decision.Action, decision.Message)
			}
			if decision.Action != validating.ActionAdmit {
				os.Exit(1)
			}
		}
	}
}

func main() {
	var maps, vaps files
	podPath := flag.String("pod", "", "the pod as created (JSON), for -m")
	mutatedPath := flag.String("mutated", "", "the pod as mutated (JSON), for -v")
	batch := flag.Int("batch", 300, "admissions per batch")
	batches := flag.Int("batches", 15, "batches per policy (the best is reported)")
	show := flag.Bool("show", false, "print each policy's result once and stop")
	profile := flag.String("cpuprofile", "", "write a Go CPU profile of the timed batches here")
	memProfile := flag.String("memprofile", "", "write a Go heap profile of the allocation counts here (every allocation sampled)")
	flag.Var(&maps, "m", "a MutatingAdmissionPolicy (YAML); repeat")
	flag.Var(&vaps, "v", "a ValidatingAdmissionPolicy (YAML); repeat")
	flag.Parse()
	var names []string
	var runs []func()
	for _, path := range maps {
		names, runs = append(names, path), append(runs, mutating(path, readPod(*podPath), *show))
	}
	for _, path := range vaps {
		names, runs = append(names, path), append(runs, validatingPolicy(path, readPod(*mutatedPath), *show))
	}
	if *show {
		for _, run := range runs {
			run()
		}
		return
	}
	if *profile != "" {
		out, err := os.Create(*profile)
		fail(err)
		fail(pprof.StartCPUProfile(out))
		defer pprof.StopCPUProfile()
	}
	best := make([]time.Duration, len(runs))
	for round := 0; round < *batches; round++ {
		for i, run := range runs {
			runtime.GC()
			started := time.Now()
			for j := 0; j < *batch; j++ {
				run()
			}
			if elapsed := time.Since(started); round == 0 || elapsed < best[i] {
				best[i] = elapsed
			}
		}
	}
	// Heap allocations per admission: unlike time, the same on every run and machine, and
	// in a serving apiserver (a large live heap) each allocated byte costs garbage
	// collection work that this small process hardly pays.
	allocated := make([]float64, len(runs))
	objects := make([]float64, len(runs))
	if *memProfile != "" {
		runtime.MemProfileRate = 1
	}
	for i, run := range runs {
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for j := 0; j < *batch; j++ {
			run()
		}
		runtime.ReadMemStats(&after)
		allocated[i] = float64(after.TotalAlloc-before.TotalAlloc) / float64(*batch)
		objects[i] = float64(after.Mallocs-before.Mallocs) / float64(*batch)
	}
	if *memProfile != "" {
		// The allocation profile shows what the last completed collection published:
		// without one here the last batch would be missing from it.
		runtime.GC()
		out, err := os.Create(*memProfile)
		fail(err)
		fail(pprof.Lookup("allocs").WriteTo(out, 0))
		fail(out.Close())
	}
	for i, name := range names {
		fmt.Printf("%8.1f us %8.1f KiB %7.0f allocs  %s\n",
			float64(best[i].Nanoseconds())/1000/float64(*batch), allocated[i]/1024, objects[i], name)
	}
}
