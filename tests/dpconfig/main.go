// Command dpconfig parses NVIDIA device plugin config files the way the device plugin's
// api/config/v1 package does, and prints what it understood as one JSON object per file.
//
// Why not import the package itself: the Go module proxy refuses
// github.com/NVIDIA/k8s-device-plugin (HTTP 403, "This module version is not available"),
// so this checker follows the structure and rules its source defines, as read at commit
// 1b826acc6af3079d8923bac395c3124b8861a9a6 (v0.20.0):
//
//   - api/config/v1/config.go: Config{version, flags, resources, sharing, imex}, decoded with
//     sigs.k8s.io/yaml (YAML -> JSON -> encoding/json); an empty version means "v1" and any
//     other version is an error; NewConfig defaults sharing.mps.failRequestsGreaterThanOne
//     to true.
//   - api/config/v1/sharing.go: Sharing{timeSlicing ReplicatedResources, mps
//     *ReplicatedResources}; the strategy is "mps" when mps has a resource with replicas > 1,
//     else "time-slicing" when timeSlicing has one, else "none".
//   - api/config/v1/replicas.go: ReplicatedResources.UnmarshalJSON (renameByDefault defaults
//     to false, resources must be present and non-empty, renameByDefault fills rename with
//     name + ".shared"); ReplicatedResource.UnmarshalJSON (name and replicas required,
//     replicas >= 2, devices default "all"); ReplicatedDevices ("all", a count > 0, or a
//     list of GPU indices, MIG indices or UUIDs).
//   - api/config/v1/resources.go and consts.go: a resource name gets the "nvidia.com/"
//     prefix when it has none, is at most 63 characters, and its name part must be a DNS
//     subdomain.
//   - api/config/v1/flags.go: the keys of flags (CommandLineFlags) and of flags.plugin
//     (PluginCommandLineFlags); of their values only flags.plugin.deviceListStrategy, the
//     one gpushare writes: one string or a list (deviceListStrategyFlag.UnmarshalJSON), each
//     one of consts.go's strategies (strategy.go, NewDeviceListStrategies: "invalid
//     strategy").
//   - DisableResourceNamingInConfig (config.go, replicas.go): custom rename values and
//     device selections are reset, so only renameByDefault can change the advertised name.
//
// It is stricter than the package in one way, on purpose: keys the package does not know
// are errors here (the package ignores them silently, which is how renameByDefault placed
// under flags: went unnoticed in k8s-device-plugin#1433).
//
// Usage: dpconfig FILE... ; exit status 1 if any file fails to parse.
package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"github.com/google/uuid"
	"k8s.io/apimachinery/pkg/api/validation"
	"sigs.k8s.io/yaml"
)

const (
	version               = "v1"
	resourceNamePrefix    = "nvidia.com"
	sharedSuffix          = ".shared"
	maxResourceNameLength = 63
	strategyMPS           = "mps"
	strategyTimeSlicing   = "time-slicing"
	strategyNone          = "none"
	minReplicas           = 2
)

// Result is what the checker prints for one file.
type Result struct {
	File                       string     `json:"file"`
	Error                      string     `json:"error,omitempty"`
	Version                    string     `json:"version,omitempty"`
	Strategy                   string     `json:"strategy,omitempty"`
	RenameByDefault            bool       `json:"renameByDefault"`
	FailRequestsGreaterThanOne *bool      `json:"failRequestsGreaterThanOne"`
	Resources                  []Resource `json:"resources"`
	DeviceListStrategy         []string   `json:"deviceListStrategy,omitempty"`
}

// deviceListStrategies are consts.go's DeviceListStrategy* values.
var deviceListStrategies = []string{"envvar", "volume-mounts", "cdi-annotations", "cdi-cri"}

// Resource is one replicated resource after the package's defaults and resets.
type Resource struct {
	Name       string `json:"name"`
	Advertised string `json:"advertised"`
	Replicas   int    `json:"replicas"`
	Devices    string `json:"devices"`
}

type replicatedResources struct {
	RenameByDefault            bool
	FailRequestsGreaterThanOne *bool
	Resources                  []replicatedResource
}

type replicatedResource struct {
	Name     string
	Rename   string
	Replicas int
	Devices  string
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dpconfig FILE...")
		os.Exit(2)
	}
	failed := false
	encoder := json.NewEncoder(os.Stdout)
	for _, file := range os.Args[1:] {
		result := check(file)
		if result.Error != "" {
			failed = true
		}
		if err := encoder.Encode(result); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
	}
	if failed {
		os.Exit(1)
	}
}

func check(file string) Result {
	result := Result{File: file, Resources: []Resource{}}
	data, err := os.ReadFile(file)
	if err != nil {
		result.Error = err.Error()
		return result
	}
	if err := parse(data, &result); err != nil {
		result.Error = err.Error()
	}
	return result
}

func parse(data []byte, result *Result) error {
	// Convert YAML to JSON the way sigs.k8s.io/yaml.Unmarshal does, then walk the JSON.
	asJSON, err := yaml.YAMLToJSON(data)
	if err != nil {
		return fmt.Errorf("unmarshal error: %v", err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(asJSON, &top); err != nil {
		return fmt.Errorf("unmarshal error: %v", err)
	}
	if err := onlyKeys("", top, "version", "flags", "resources", "sharing", "imex"); err != nil {
		return err
	}
	result.Version = version
	if raw, ok := top["version"]; ok {
		if err := json.Unmarshal(raw, &result.Version); err != nil {
			return fmt.Errorf("version: %v", err)
		}
		if result.Version == "" {
			result.Version = version
		}
	}
	if result.Version != version {
		return fmt.Errorf("unknown version: %v", result.Version)
	}
	if raw, ok := top["flags"]; ok {
		// flags.go, CommandLineFlags (embedded in Flags): the keys a config's flags may set.
		var flags map[string]json.RawMessage
		if err := json.Unmarshal(raw, &flags); err != nil {
			return fmt.Errorf("flags: %v", err)
		}
		if err := onlyKeys("flags.", flags, "migStrategy", "failOnInitError", "mpsRoot",
			"nvidiaDriverRoot", "nvidiaDevRoot", "gdrcopyEnabled", "gdsEnabled", "mofedEnabled",
			"useNodeFeatureAPI", "deviceDiscoveryStrategy", "plugin", "gfd"); err != nil {
			return err
		}
		if raw, ok := flags["plugin"]; ok {
			strategies, err := parsePluginFlags(raw)
			if err != nil {
				return err
			}
			result.DeviceListStrategy = strategies
		}
	}
	var sharing map[string]json.RawMessage
	if raw, ok := top["sharing"]; ok {
		if err := json.Unmarshal(raw, &sharing); err != nil {
			return fmt.Errorf("sharing: %v", err)
		}
	}
	if err := onlyKeys("sharing.", sharing, "timeSlicing", "mps"); err != nil {
		return err
	}
	var timeSlicing, mps *replicatedResources
	if raw, ok := sharing["timeSlicing"]; ok {
		if timeSlicing, err = parseReplicated("sharing.timeSlicing", raw); err != nil {
			return err
		}
	}
	if raw, ok := sharing["mps"]; ok && string(raw) != "null" {
		if mps, err = parseReplicated("sharing.mps", raw); err != nil {
			return err
		}
		// config.go NewConfig: "Preserve the historical MPS behavior unless the config
		// explicitly relaxes it."
		if mps.FailRequestsGreaterThanOne == nil {
			t := true
			mps.FailRequestsGreaterThanOne = &t
		}
	}
	active := timeSlicing
	result.Strategy = strategyNone
	if mps != nil {
		// Sharing.ReplicatedResources: MPS, when present, is the one in force.
		active = mps
		if replicated(mps) {
			result.Strategy = strategyMPS
		}
	} else if replicated(timeSlicing) {
		result.Strategy = strategyTimeSlicing
	}
	if active == nil {
		return nil
	}
	result.RenameByDefault = active.RenameByDefault
	result.FailRequestsGreaterThanOne = active.FailRequestsGreaterThanOne
	for _, r := range active.Resources {
		advertised := r.Name
		if active.RenameByDefault {
			// DisableResourceNamingInConfig: with renameByDefault only the default rename
			// survives; without it any rename is dropped.
			advertised = r.Name + sharedSuffix
		}
		result.Resources = append(result.Resources, Resource{
			Name: r.Name, Advertised: advertised, Replicas: r.Replicas, Devices: "all",
		})
	}
	return nil
}

func replicated(r *replicatedResources) bool {
	if r == nil {
		return false
	}
	for _, resource := range r.Resources {
		if resource.Replicas > 1 {
			return true
		}
	}
	return false
}

func parseReplicated(where string, raw json.RawMessage) (*replicatedResources, error) {
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("%s: %v", where, err)
	}
	if err := onlyKeys(where+".", fields, "renameByDefault", "failRequestsGreaterThanOne", "resources"); err != nil {
		return nil, err
	}
	out := &replicatedResources{}
	if v, ok := fields["renameByDefault"]; ok {
		if err := json.Unmarshal(v, &out.RenameByDefault); err != nil {
			return nil, fmt.Errorf("%s.renameByDefault: %v", where, err)
		}
	}
	if v, ok := fields["failRequestsGreaterThanOne"]; ok {
		if err := json.Unmarshal(v, &out.FailRequestsGreaterThanOne); err != nil {
			return nil, fmt.Errorf("%s.failRequestsGreaterThanOne: %v", where, err)
		}
	}
	rawResources, ok := fields["resources"]
	if !ok {
		return nil, fmt.Errorf("%s: no resources specified", where)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(rawResources, &items); err != nil {
		return nil, fmt.Errorf("%s.resources: %v", where, err)
	}
	if len(items) == 0 {
		return nil, fmt.Errorf("%s: no resources specified", where)
	}
	for i, item := range items {
		resource, err := parseResource(fmt.Sprintf("%s.resources[%d]", where, i), item)
		if err != nil {
			return nil, err
		}
		if out.RenameByDefault && resource.Rename == "" {
			resource.Rename = resource.Name + sharedSuffix
		}
		out.Resources = append(out.Resources, resource)
	}
	return out, nil
}

func parseResource(where string, raw json.RawMessage) (replicatedResource, error) {
	var out replicatedResource
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return out, fmt.Errorf("%s: %v", where, err)
	}
	if err := onlyKeys(where+".", fields, "name", "rename", "devices", "replicas"); err != nil {
		return out, err
	}
	name, ok := fields["name"]
	if !ok {
		return out, fmt.Errorf("%s: no resource name specified", where)
	}
	var err error
	if out.Name, err = resourceName(name); err != nil {
		return out, fmt.Errorf("%s.name: %v", where, err)
	}
	out.Devices = "all"
	if devices, ok := fields["devices"]; ok {
		if out.Devices, err = parseDevices(devices); err != nil {
			return out, fmt.Errorf("%s.devices: %v", where, err)
		}
	}
	replicas, ok := fields["replicas"]
	if !ok {
		return out, fmt.Errorf("%s: no replicas specified", where)
	}
	if err := json.Unmarshal(replicas, &out.Replicas); err != nil {
		return out, fmt.Errorf("%s.replicas: %v", where, err)
	}
	if out.Replicas < minReplicas {
		return out, fmt.Errorf("%s: number of replicas must be >= %d", where, minReplicas)
	}
	if rename, ok := fields["rename"]; ok {
		if out.Rename, err = resourceName(rename); err != nil {
			return out, fmt.Errorf("%s.rename: %v", where, err)
		}
	}
	return out, nil
}

func resourceName(raw json.RawMessage) (string, error) {
	var name string
	if err := json.Unmarshal(raw, &name); err != nil {
		return "", err
	}
	if !strings.HasPrefix(name, resourceNamePrefix+"/") {
		name = resourceNamePrefix + "/" + name
	}
	if len(name) > maxResourceNameLength {
		return "", fmt.Errorf("fully-qualified resource name must be %v characters or less: %v", maxResourceNameLength, name)
	}
	_, short, _ := strings.Cut(name, "/")
	if invalid := validation.NameIsDNSSubdomain(short, false); len(invalid) != 0 {
		return "", fmt.Errorf("incorrect format for resource name '%v': %v", name, invalid)
	}
	return name, nil
}

func parseDevices(raw json.RawMessage) (string, error) {
	var all string
	if json.Unmarshal(raw, &all) == nil {
		if all != "all" {
			return "", fmt.Errorf("devices set as '%v' but the only valid string input is 'all'", all)
		}
		return "all", nil
	}
	var count int
	if json.Unmarshal(raw, &count) == nil {
		if count <= 0 {
			return "", fmt.Errorf("devices set as '%v' but a count of devices must be > 0", count)
		}
		return strconv.Itoa(count), nil
	}
	var list []json.RawMessage
	if err := json.Unmarshal(raw, &list); err != nil {
		return "", fmt.Errorf("unrecognized type for devices spec: %v", string(raw))
	}
	refs := make([]string, 0, len(list))
	for _, item := range list {
		var index uint64
		if json.Unmarshal(item, &index) == nil {
			refs = append(refs, strconv.FormatUint(index, 10))
			continue
		}
		var ref string
		if json.Unmarshal(item, &ref) == nil && validDeviceRef(ref) {
			refs = append(refs, ref)
			continue
		}
		return "", fmt.Errorf("unsupported type for device in devices list: %v", string(item))
	}
	return strings.Join(refs, ","), nil
}

func validDeviceRef(ref string) bool {
	if _, err := strconv.ParseUint(ref, 10, 0); err == nil {
		return true
	}
	if a, b, ok := strings.Cut(ref, ":"); ok {
		_, errA := strconv.ParseUint(a, 10, 0)
		_, errB := strconv.ParseUint(b, 10, 0)
		if errA == nil && errB == nil {
			return true
		}
	}
	if rest, ok := strings.CutPrefix(ref, "GPU-"); ok {
		return uuid.Validate(rest) == nil
	}
	if rest, ok := strings.CutPrefix(ref, "MIG-"); ok {
		if uuid.Validate(rest) == nil {
			return true
		}
		parts := strings.SplitN(rest, "/", 3)
		return len(parts) == 3 && validDeviceRef(parts[0]) && strings.HasPrefix(parts[0], "GPU-")
	}
	return false
}

// parsePluginFlags checks flags.plugin's keys and returns its deviceListStrategy, if set.
func parsePluginFlags(raw json.RawMessage) ([]string, error) {
	var plugin map[string]json.RawMessage
	if err := json.Unmarshal(raw, &plugin); err != nil {
		return nil, fmt.Errorf("flags.plugin: %v", err)
	}
	if err := onlyKeys("flags.plugin.", plugin, "passDeviceSpecs", "deviceListStrategy",
		"deviceIDStrategy", "cdiAnnotationPrefix", "nvidiaCTKPath", "containerDriverRoot",
		"sharedDevicesAllocationPolicy"); err != nil {
		return nil, err
	}
	value, ok := plugin["deviceListStrategy"]
	if !ok {
		return nil, nil
	}
	var strategies []string
	var single string
	if err := json.Unmarshal(value, &single); err == nil {
		strategies = []string{single}
	} else if err := json.Unmarshal(value, &strategies); err != nil {
		return nil, fmt.Errorf("invalid deviceListStrategy: %v", string(value))
	}
	for _, strategy := range strategies {
		known := false
		for _, k := range deviceListStrategies {
			known = known || strategy == k
		}
		if !known {
			return nil, fmt.Errorf("invalid strategy: %v", strategy)
		}
	}
	return strategies, nil
}

// onlyKeys fails on keys the package does not define (see the package comment: stricter on
// purpose).
func onlyKeys(prefix string, fields map[string]json.RawMessage, known ...string) error {
	var unknown []string
	for key := range fields {
		found := false
		for _, k := range known {
			if key == k {
				found = true
				break
			}
		}
		if !found {
			unknown = append(unknown, prefix+key)
		}
	}
	if len(unknown) > 0 {
		sort.Strings(unknown)
		return errors.New("unknown field(s) " + strings.Join(unknown, ", ") +
			" (the device plugin would ignore them silently)")
	}
	return nil
}
