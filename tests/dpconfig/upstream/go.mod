module gpushare/tests/dpconfig/upstream

go 1.26.0

require (
	github.com/NVIDIA/k8s-device-plugin v0.20.0
	github.com/urfave/cli/v2 v2.27.7
)
