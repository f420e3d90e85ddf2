// Command harness is the gpushare end-to-end test control plane in one binary.
//
// Each subcommand runs one component as its own process, the way harness/controlplane.py starts them:
//
//	harness etcd --data-dir D --listen-client-url http://127.0.0.1:P --listen-peer-url http://127.0.0.1:Q
//	harness apiserver <kube-apiserver flags>
//	harness scheduler <kube-scheduler flags>
//	harness controller-manager <kube-controller-manager flags>
//	harness kubectl <kubectl args>
//
// The apiserver, scheduler and controller-manager each install the process-wide signal handler, which panics
// when set up twice, so they must not share a process.
package main

import (
	"flag"
	"fmt"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"
	_ "time/tzdata" // kube-apiserver: time zone support for CronJob validation

	"go.etcd.io/etcd/server/v3/embed"
	"k8s.io/component-base/cli"
	"k8s.io/component-base/logs"
	_ "k8s.io/component-base/logs/json/register"          // JSON log format, as upstream's mains
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics, as upstream's mains
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric, as upstream's mains
	kubectl "k8s.io/kubectl/pkg/cmd"
	kubectlutil "k8s.io/kubectl/pkg/cmd/util"
	apiserver "k8s.io/kubernetes/cmd/kube-apiserver/app"
	controllermanager "k8s.io/kubernetes/cmd/kube-controller-manager/app"
	scheduler "k8s.io/kubernetes/cmd/kube-scheduler/app"
)

const usage = `usage: harness <etcd|apiserver|scheduler|controller-manager|kubectl> [flags]`

// init runs on the main OS thread (the runtime locks it there during initialization).
// The parent-death signal belongs to the thread that asks for it and is lost if that
// thread exits; the main thread lives as long as the process, other Go threads may not.
func init() {
	exitWithParent()
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, usage)
		os.Exit(2)
	}
	sub := os.Args[1]
	// Cobra and kubectl's plugin handling read os.Args; hide the subcommand from them.
	os.Args = append([]string{sub}, os.Args[2:]...)

	switch sub {
	case "etcd":
		os.Exit(runEtcd(os.Args[1:]))
	case "apiserver":
		os.Exit(cli.Run(apiserver.NewAPIServerCommand()))
	case "scheduler":
		os.Exit(cli.Run(scheduler.NewSchedulerCommand()))
	case "controller-manager":
		os.Exit(cli.Run(controllermanager.NewControllerManagerCommand()))
	case "kubectl":
		runKubectl()
	default:
		fmt.Fprintf(os.Stderr, "unknown subcommand %q\n%s\n", sub, usage)
		os.Exit(2)
	}
}

// runKubectl mirrors k8s.io/kubernetes/cmd/kubectl's main.
func runKubectl() {
	logs.GlogSetter(kubectl.GetLogVerbosity(os.Args)) //nolint:errcheck
	command := kubectl.NewDefaultKubectlCommand()
	if err := cli.RunNoErrOutput(command); err != nil {
		kubectlutil.CheckErr(err)
	}
	os.Exit(0)
}

// runEtcd starts a single-member embedded etcd for tests and serves until SIGTERM/SIGINT.
func runEtcd(args []string) int {
	fs := flag.NewFlagSet("etcd", flag.ContinueOnError)
	dataDir := fs.String("data-dir", "", "data directory (required)")
	clientURL := fs.String("listen-client-url", "http://127.0.0.1:2379", "client URL to listen on and advertise")
	peerURL := fs.String("listen-peer-url", "http://127.0.0.1:2380", "peer URL to listen on and advertise")
	logLevel := fs.String("log-level", "warn", "etcd log level")
	startTimeout := fs.Duration("start-timeout", 60*time.Second, "how long to wait for the server to become ready")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dataDir == "" {
		fmt.Fprintln(os.Stderr, "etcd: --data-dir is required")
		return 2
	}
	cu, err := url.Parse(*clientURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-client-url: %v\n", err)
		return 2
	}
	pu, err := url.Parse(*peerURL)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: bad --listen-peer-url: %v\n", err)
		return 2
	}

	cfg := embed.NewConfig()
	cfg.Dir = *dataDir
	// Tests never restart this member or keep its data; fsync only costs time.
	cfg.UnsafeNoFsync = true
	cfg.LogLevel = *logLevel
	cfg.ListenClientUrls = []url.URL{*cu}
	cfg.AdvertiseClientUrls = []url.URL{*cu}
	cfg.ListenPeerUrls = []url.URL{*pu}
	cfg.AdvertisePeerUrls = []url.URL{*pu}
	cfg.InitialCluster = cfg.InitialClusterFromName(cfg.Name)

	e, err := embed.StartEtcd(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "etcd: start: %v\n", err)
		return 1
	}
	defer e.Close()

	select {
	case <-e.Server.ReadyNotify():
		fmt.Fprintf(os.Stderr, "etcd: ready, serving clients on %s\n", cu)
	case <-time.After(*startTimeout):
		e.Server.Stop()
		fmt.Fprintln(os.Stderr, "etcd: took too long to become ready")
		return 1
	}

	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT)
	select {
	case s := <-sigs:
		fmt.Fprintf(os.Stderr, "etcd: %v, shutting down\n", s)
		return 0
	case err := <-e.Err():
		fmt.Fprintf(os.Stderr, "etcd: server error: %v\n", err)
		return 1
	}
}
