"""The e2e control plane and gpushare's webhook beside it, shared by tests/e2e and bench/.

The Go program in this directory (main.go, built by build.sh into a cache outside the
repository) is one static binary holding upstream etcd, kube-apiserver, kube-scheduler and
kubectl. The Python modules start and drive it; see README.md for the binary itself.

Not part of the installed `gpushare` package: tests and benchmarks import it from the
repository root (pytest's `pythonpath`, or the root on `sys.path` in bench scripts).
"""
