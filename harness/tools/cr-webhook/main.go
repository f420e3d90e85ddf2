// cr-webhook is bench/e2e_bench.py's peer: a mutating pod webhook written the way
// controller-runtime's users write one, with its defaults (webhook.Server, a typed
// admission.Defaulter for pods: the decoder, a deep copy, json.Marshal and
// admission.PatchResponseFromRaw; HTTP/2 offered as the server offers it, its metrics and
// its certificate watcher). It applies exactly the mutation gpushare's bundled default
// policy (policies/default.yaml) applies to the benchmark's pod (a TensorFlow container,
// gpu-fraction "0.5"), hard-coded: a peer doing the same work for the benchmark, not a
// reimplementation of gpushare. The benchmark checks, field by field, that the apiserver
// stores the same pod under it as under gpushare's webhook before measuring. Other pods are
// let through unchanged.
//
//	cr-webhook -cert tls.crt -key tls.key -addr 127.0.0.1:9443 -policy-version 85a40f50e99d
//
// The certificate and key must be in one directory (webhook.Options takes a directory and
// two file names); -policy-version is the default policy's version, as gpushare writes it
// into the gpushare.io/applied annotation.
package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"flag"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/runtime"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/log/zap"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

const (
	fractionAnnotation = "gpu-fraction"
	appliedAnnotation  = "gpushare.io/applied"
	sharedResource     = corev1.ResourceName("nvidia.com/gpu.shared")
)

// applied is gpushare's gpushare.io/applied record, its keys in gpushare's (sorted) order.
type applied struct {
	Container     string `json:"container"`
	Fraction      string `json:"fraction"`
	Mode          string `json:"mode"`
	Policy        string `json:"policy"`
	PolicyVersion string `json:"policyVersion"`
	Pool          string `json:"pool"`
	Resource      string `json:"resource"`
	Slots         int    `json:"slots"`
}

// sharePod gives the benchmark's pod what the default policy gives it: one slot of the
// ts-half pool (time-slicing, 2 replicas), TensorFlow's allow-growth knob, the pool's node
// selector and the GPU toleration, and the applied record.
type sharePod struct {
	policyVersion string
}

func (d *sharePod) Default(_ context.Context, pod *corev1.Pod) error {
	fraction, ok := pod.Annotations[fractionAnnotation]
	if !ok || fraction != "0.5" || len(pod.Spec.Containers) != 1 {
		return nil // not the benchmark's pod shape: let it through
	}
	container := &pod.Spec.Containers[0]
	slot := resource.MustParse("1")
	if container.Resources.Limits == nil {
		container.Resources.Limits = corev1.ResourceList{}
	}
	if container.Resources.Requests == nil {
		container.Resources.Requests = corev1.ResourceList{}
	}
	container.Resources.Limits[sharedResource] = slot
	container.Resources.Requests[sharedResource] = slot.DeepCopy()
	container.Env = append(container.Env, corev1.EnvVar{Name: "TF_FORCE_GPU_ALLOW_GROWTH", Value: "true"})
	if pod.Spec.NodeSelector == nil {
		pod.Spec.NodeSelector = map[string]string{}
	}
	pod.Spec.NodeSelector["nvidia.com/gpu.replicas"] = "2"
	pod.Spec.NodeSelector["nvidia.com/gpu.sharing-strategy"] = "time-slicing"
	pod.Spec.Tolerations = append(pod.Spec.Tolerations, corev1.Toleration{
		Key: "nvidia.com/gpu", Operator: corev1.TolerationOpExists, Effect: corev1.TaintEffectNoSchedule,
	})
	record, err := json.Marshal(applied{
		Container: container.Name, Fraction: fraction, Mode: "time-slicing", Policy: "default",
		PolicyVersion: d.policyVersion, Pool: "ts-half", Resource: string(sharedResource), Slots: 1,
	})
	if err != nil {
		return err
	}
	pod.Annotations[appliedAnnotation] = string(record)
	return nil
}

func main() {
	addr := flag.String("addr", "127.0.0.1:9443", "listen address (loopback)")
	cert := flag.String("cert", "", "serving certificate (PEM)")
	key := flag.String("key", "", "its private key (PEM), in the certificate's directory")
	version := flag.String("policy-version", "", "the default policy's version, for the applied record")
	// controller-runtime's webhook.Server offers HTTP/2 by default; kubebuilder's scaffold
	// turns it off (CVE-2023-44487), which this flag does the same way, through TLSOpts.
	http1 := flag.Bool("disable-http2", false, "offer HTTP/1.1 only, as kubebuilder's scaffold does")
	flag.Parse()
	ctrllog.SetLogger(zap.New())
	if err := run(*addr, *cert, *key, *version, *http1); err != nil {
		fmt.Fprintln(os.Stderr, "cr-webhook:", err)
		os.Exit(1)
	}
}

func run(addr, cert, key, version string, http1 bool) error {
	if version == "" {
		return fmt.Errorf("-policy-version is required")
	}
	if filepath.Dir(cert) != filepath.Dir(key) {
		return fmt.Errorf("-cert and -key must be in one directory")
	}
	host, portText, err := net.SplitHostPort(addr)
	if err != nil {
		return err
	}
	port, err := strconv.Atoi(portText)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := corev1.AddToScheme(scheme); err != nil {
		return err
	}
	options := webhook.Options{
		Host: host, Port: port, CertDir: filepath.Dir(cert),
		CertName: filepath.Base(cert), KeyName: filepath.Base(key),
	}
	if http1 {
		options.TLSOpts = []func(*tls.Config){func(c *tls.Config) { c.NextProtos = []string{"http/1.1"} }}
	}
	server := webhook.NewServer(options)
	server.Register("/mutate", admission.WithDefaulter[*corev1.Pod](scheme, &sharePod{policyVersion: version}))
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	return server.Start(ctx)
}
