// Command dpconfig-upstream parses device plugin config files with NVIDIA's own package,
// github.com/NVIDIA/k8s-device-plugin/api/config/v1, exactly as the device plugin does:
// v1.NewConfig reads the file named by the "config-file" flag (its parseConfigFrom is not
// exported; cmd/nvidia-device-plugin/main.go, loadConfig, goes through NewConfig too), and
// v1.DisableResourceNamingInConfig applies the resets the plugin applies before use.
//
// It prints the same JSON as ../main.go, so the Python test compares both checkers' output.
// It builds only where the Go module proxy serves github.com/NVIDIA/k8s-device-plugin; the
// test skips it (and says so) where the proxy refuses the module.
package main

import (
	"encoding/json"
	"fmt"
	"os"

	spec "github.com/NVIDIA/k8s-device-plugin/api/config/v1"
	cli "github.com/urfave/cli/v2"
)

// Result mirrors ../main.go's Result.
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

// Resource mirrors ../main.go's Resource.
type Resource struct {
	Name       string `json:"name"`
	Advertised string `json:"advertised"`
	Replicas   int    `json:"replicas"`
	Devices    string `json:"devices"`
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: dpconfig-upstream FILE...")
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
	flags := []cli.Flag{&cli.StringFlag{Name: "config-file"}}
	var config *spec.Config
	app := &cli.App{
		Name:  "dpconfig-upstream",
		Flags: flags,
		Action: func(c *cli.Context) error {
			var err error
			config, err = spec.NewConfig(c, flags)
			return err
		},
	}
	if err := app.Run([]string{"dpconfig-upstream", "--config-file", file}); err != nil {
		result.Error = err.Error()
		return result
	}
	spec.DisableResourceNamingInConfig(config)
	if plugin := config.Flags.Plugin; plugin != nil && plugin.DeviceListStrategy != nil {
		strategies := []string(*plugin.DeviceListStrategy)
		if _, err := spec.NewDeviceListStrategies(strategies); err != nil {
			result.Error = err.Error()
			return result
		}
		result.DeviceListStrategy = strategies
	}
	result.Version = config.Version
	result.Strategy = string(config.Sharing.SharingStrategy())
	active := config.Sharing.ReplicatedResources()
	result.RenameByDefault = active.RenameByDefault
	result.FailRequestsGreaterThanOne = active.FailRequestsGreaterThanOne
	for _, r := range active.Resources {
		advertised := string(r.Name)
		if r.Rename != "" {
			advertised = string(r.Rename)
		}
		devices := "all"
		if !r.Devices.All {
			raw, _ := json.Marshal(&r.Devices)
			devices = string(raw)
		}
		result.Resources = append(result.Resources, Resource{
			Name: string(r.Name), Advertised: advertised, Replicas: r.Replicas, Devices: devices,
		})
	}
	return result
}
