"""The e2e control plane and gpushare's webhook beside it, shared by tests/e2e and bench/.

The Go program in this directory (main.go; README.md) is one static binary holding upstream
etcd, kube-apiserver, kube-scheduler and kubectl. The Python modules build, start and drive it:

- binary: build.sh run from Python, returning the cached binary's path;
- processes: loopback ports, logged subprocesses, polling with deadlines;
- pki, controlplane: the control plane's certificates, and etcd + apiserver (+ scheduler);
- cli: the `gpushare` command line as a user runs it;
- webhookserver: `gpushare serve` on a loopback port, its metrics and admission log;
- api: pod creates that keep the apiserver's raw answer and warnings, and small API helpers;
- registration: gpushare's webhook configurations applied, probed until in force, removed;
- operator_crds: the GPU operators' CRDs and published samples, taken from their Go modules
  at the versions pinned in tools/operator-crds/modules.txt.

Not part of the installed `gpushare` package: tests and benchmarks import it from the
repository root (pytest's `pythonpath`, or the root on `sys.path` in bench scripts).
"""
