// `promql test-rules FILE...`: unit tests of alerting rules in the format of promtool's
// `test rules` (https://prometheus.io/docs/prometheus/latest/configuration/unit_testing_rules/),
// run on Prometheus's own rule manager (github.com/prometheus/prometheus/rules) over series
// loaded by its own test storage (promql/promqltest.LazyLoader), as promtool does
// (cmd/promtool/unittest.go, which is package main and so cannot be imported: this file
// follows its loop). tests/test_monitoring.py runs it on tests/promql/rules/*.yaml.
//
// The format is promtool's, with two differences, both about gpushare's files:
//   - a rule file may be a Prometheus Operator PrometheusRule object: its spec (groups) is
//     what is loaded, as the operator hands it to Prometheus;
//   - exp_annotations are compared on the keys given only (promtool compares them all), so
//     a test names the annotations it is about (the summary's value, the runbook_url).
//
// Supported keys: rule_files, evaluation_interval, tests[].name, interval, input_series
// (series, values in promtool's expanding notation), external_url, and alert_rule_test
// (eval_time, alertname, exp_alerts with exp_labels and exp_annotations). Unknown keys are
// refused (promtool reads strictly too). promql_expr_test is not supported.
//
// Output: a JSON array, per file {file, error, tests: [{name, errors, fired}]}, where fired
// lists every alert that was firing at any evaluation of the test (for checks that each
// alert has a test that fires it, and that a healthy set fires nothing).
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/prometheus/common/model"
	"github.com/prometheus/common/promslog"
	"go.yaml.in/yaml/v2"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
	"github.com/prometheus/prometheus/promql/promqltest"
	"github.com/prometheus/prometheus/rules"
)

type unitTestFile struct {
	RuleFiles          []string       `yaml:"rule_files"`
	EvaluationInterval model.Duration `yaml:"evaluation_interval,omitempty"`
	Tests              []testGroup    `yaml:"tests"`
}

type testGroup struct {
	Name           string          `yaml:"name"`
	Interval       model.Duration  `yaml:"interval"`
	InputSeries    []series        `yaml:"input_series"`
	AlertRuleTests []alertTestCase `yaml:"alert_rule_test"`
	ExternalURL    string          `yaml:"external_url,omitempty"`
}

type series struct {
	Series string `yaml:"series"`
	Values string `yaml:"values"`
}

type alertTestCase struct {
	EvalTime  model.Duration `yaml:"eval_time"`
	Alertname string         `yaml:"alertname"`
	ExpAlerts []expAlert     `yaml:"exp_alerts"`
}

type expAlert struct {
	ExpLabels      map[string]string `yaml:"exp_labels"`
	ExpAnnotations map[string]string `yaml:"exp_annotations"`
}

// FileResult is what one unit test file gave.
type FileResult struct {
	File  string       `json:"file"`
	Error string       `json:"error,omitempty"`
	Tests []TestResult `json:"tests"`
}

// TestResult is one test group: its failures and the alerts it saw firing.
type TestResult struct {
	Name   string   `json:"name"`
	Errors []string `json:"errors"`
	Fired  []string `json:"fired"`
}

func testRules(files []string) int {
	results := make([]FileResult, 0, len(files))
	for _, file := range files {
		results = append(results, runFile(file))
	}
	if err := json.NewEncoder(os.Stdout).Encode(results); err != nil {
		fmt.Fprintln(os.Stderr, "promql test-rules: writing stdout:", err)
		return 2
	}
	return 0
}

func runFile(file string) FileResult {
	result := FileResult{File: file, Tests: []TestResult{}}
	content, err := os.ReadFile(file)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	var unit unitTestFile
	if err := yaml.UnmarshalStrict(content, &unit); err != nil {
		result.Error = err.Error()
		return result
	}
	if unit.EvaluationInterval == 0 {
		unit.EvaluationInterval = model.Duration(time.Minute)
	}
	scratch, err := os.MkdirTemp("", "promql-rules-")
	if err != nil {
		result.Error = err.Error()
		return result
	}
	defer os.RemoveAll(scratch)
	ruleFiles := make([]string, 0, len(unit.RuleFiles))
	for i, name := range unit.RuleFiles {
		if !filepath.IsAbs(name) {
			name = filepath.Join(filepath.Dir(file), name)
		}
		loadable, err := ruleFile(name, filepath.Join(scratch, fmt.Sprintf("%d.yaml", i)))
		if err != nil {
			result.Error = err.Error()
			return result
		}
		ruleFiles = append(ruleFiles, loadable)
	}
	for i, group := range unit.Tests {
		if group.Interval == 0 {
			group.Interval = unit.EvaluationInterval
		}
		name := group.Name
		if name == "" {
			name = fmt.Sprintf("unnamed#%d", i)
		}
		errs, fired := group.run(time.Duration(unit.EvaluationInterval), ruleFiles)
		test := TestResult{Name: name, Errors: []string{}, Fired: fired}
		for _, e := range errs {
			test.Errors = append(test.Errors, e.Error())
		}
		result.Tests = append(result.Tests, test)
	}
	return result
}

// ruleFile returns a file the rule manager loads: the file itself, or for a PrometheusRule
// object its spec written to scratch.
func ruleFile(name, scratch string) (string, error) {
	content, err := os.ReadFile(name)
	if err != nil {
		return "", err
	}
	var object struct {
		APIVersion string        `yaml:"apiVersion"`
		Kind       string        `yaml:"kind"`
		Spec       yaml.MapSlice `yaml:"spec"`
	}
	if err := yaml.Unmarshal(content, &object); err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if object.Kind != "PrometheusRule" {
		return name, nil
	}
	if !strings.HasPrefix(object.APIVersion, "monitoring.coreos.com/") {
		return "", fmt.Errorf("%s: a PrometheusRule of %q", name, object.APIVersion)
	}
	spec, err := yaml.Marshal(object.Spec)
	if err != nil {
		return "", err
	}
	return scratch, os.WriteFile(scratch, spec, 0o600)
}

// run evaluates the rule groups at every evaluation interval from 0 to the last eval_time
// and compares the firing alerts at each eval_time, as promtool's testGroup.test does.
func (tg *testGroup) run(evalInterval time.Duration, ruleFiles []string) ([]error, []string) {
	promqlParser := parser.NewParser(parser.Options{})
	// promtool's options (cmd/promtool/main.go): what a Prometheus server evaluates.
	suite, err := promqltest.NewLazyLoader(tg.loadCommand(), promqltest.LazyLoaderOpts{
		EnableAtModifier:     true,
		EnableNegativeOffset: true,
		Parser:               promqlParser,
	})
	if err != nil {
		return []error{err}, []string{}
	}
	defer suite.Close()
	suite.SubqueryInterval = evalInterval

	manager := rules.NewManager(&rules.ManagerOptions{
		QueryFunc:    rules.EngineQueryFunc(suite.QueryEngine(), suite.Storage()),
		AppendableV2: suite.Storage(),
		Context:      context.Background(),
		NotifyFunc:   func(context.Context, string, ...*rules.Alert) {},
		Logger:       promslog.NewNopLogger(),
		Parser:       promqlParser,
	})
	groupsByName, errs := manager.LoadGroups(
		time.Duration(tg.Interval), labels.EmptyLabels(), tg.ExternalURL, nil, false, ruleFiles...,
	)
	if errs != nil {
		return errs, []string{}
	}
	groups := make([]*rules.Group, 0, len(groupsByName))
	for _, group := range groupsByName {
		groups = append(groups, group)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Name() < groups[j].Name() })
	for _, group := range groups {
		for _, rule := range group.Rules() {
			if alerting, ok := rule.(*rules.AlertingRule); ok {
				// As promtool: the ALERTS series are written from the first evaluation.
				alerting.SetRestored(true)
			}
		}
	}

	byTime := map[model.Duration][]alertTestCase{}
	var times []model.Duration
	var maxTime model.Duration
	for _, test := range tg.AlertRuleTests {
		if test.Alertname == "" {
			return []error{fmt.Errorf("an alert_rule_test at %v names no alertname", test.EvalTime)}, []string{}
		}
		if _, seen := byTime[test.EvalTime]; !seen {
			times = append(times, test.EvalTime)
		}
		byTime[test.EvalTime] = append(byTime[test.EvalTime], test)
		maxTime = max(maxTime, test.EvalTime)
	}
	sort.Slice(times, func(i, j int) bool { return times[i] < times[j] })

	fired := map[string]bool{}
	var failures []error
	start := time.Unix(0, 0).UTC()
	next := 0
	for ts := start; !ts.After(start.Add(time.Duration(maxTime))); ts = ts.Add(evalInterval) {
		var evalErrs []error
		suite.WithSamplesTill(ts, func(err error) {
			if err != nil {
				evalErrs = append(evalErrs, err)
				return
			}
			for _, group := range groups {
				group.Eval(suite.Context(), ts)
				for _, rule := range group.Rules() {
					if rule.LastError() != nil {
						evalErrs = append(evalErrs, fmt.Errorf("rule %s at %v: %w", rule.Name(), ts.Sub(start), rule.LastError()))
					}
				}
			}
		})
		if len(evalErrs) > 0 {
			return append(failures, evalErrs...), sortedKeys(fired)
		}
		firing := firingAlerts(groups)
		for name := range firing {
			fired[name] = true
		}
		// An eval_time between two evaluations is checked against the earlier one.
		for next < len(times) && time.Duration(times[next]) < ts.Add(evalInterval).Sub(start) {
			for _, test := range byTime[times[next]] {
				if err := compare(test, firing[test.Alertname]); err != nil {
					failures = append(failures, err)
				}
			}
			next++
		}
	}
	return failures, sortedKeys(fired)
}

func (tg *testGroup) loadCommand() string {
	var load strings.Builder
	fmt.Fprintf(&load, "load %v\n", tg.Interval)
	for _, s := range tg.InputSeries {
		fmt.Fprintf(&load, "  %v %v\n", s.Series, s.Values)
	}
	return load.String()
}

func firingAlerts(groups []*rules.Group) map[string][]*rules.Alert {
	firing := map[string][]*rules.Alert{}
	for _, group := range groups {
		for _, rule := range group.Rules() {
			alerting, ok := rule.(*rules.AlertingRule)
			if !ok {
				continue
			}
			for _, alert := range alerting.ActiveAlerts() {
				if alert.State == rules.StateFiring {
					firing[alerting.Name()] = append(firing[alerting.Name()], alert)
				}
			}
		}
	}
	return firing
}

// compare: the expected alerts are exactly the firing ones, by their labels (alertname
// added as promtool adds it), each with the expected annotations among its own.
func compare(test alertTestCase, got []*rules.Alert) error {
	remaining := append([]*rules.Alert(nil), got...)
	var missing []string
	for _, want := range test.ExpAlerts {
		wanted := map[string]string{labels.AlertName: test.Alertname}
		for k, v := range want.ExpLabels {
			wanted[k] = v
		}
		wantLabels := labels.FromMap(wanted)
		found := -1
		for i, alert := range remaining {
			if labels.Equal(alert.Labels, wantLabels) && annotationsMatch(alert.Annotations, want.ExpAnnotations) {
				found = i
				break
			}
		}
		if found < 0 {
			missing = append(missing, fmt.Sprintf("%v %v", wantLabels, want.ExpAnnotations))
			continue
		}
		remaining = append(remaining[:found], remaining[found+1:]...)
	}
	if len(missing) == 0 && len(remaining) == 0 {
		return nil
	}
	var unexpected []string
	for _, alert := range remaining {
		unexpected = append(unexpected, fmt.Sprintf("%v %v", alert.Labels, alert.Annotations))
	}
	var all []string
	for _, alert := range got {
		all = append(all, fmt.Sprintf("%v %v", alert.Labels, alert.Annotations))
	}
	return fmt.Errorf("alertname %s at %v: expected but not firing: %v; firing but not expected: %v; firing: %v",
		test.Alertname, test.EvalTime, missing, unexpected, all)
}

func annotationsMatch(got labels.Labels, want map[string]string) bool {
	for key, value := range want {
		if got.Get(key) != value {
			return false
		}
	}
	return true
}

func sortedKeys(set map[string]bool) []string {
	keys := make([]string, 0, len(set))
	for key := range set {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	return keys
}
