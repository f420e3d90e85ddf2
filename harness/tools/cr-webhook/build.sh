#!/usr/bin/env bash
# Builds the controller-runtime peer webhook (bench/e2e_bench.py's "peer" mode) into a
# content-addressed cache outside the repository and prints the binary's path on the last
# line of stdout, like harness/build.sh (../build-go-tool.sh does it).
# sigs.k8s.io/controller-runtime and the k8s.io modules it asks for, from the module proxy.
#
#   GPUSHARE_CR_WEBHOOK_DIR  cache directory (default: $HOME/.cache/gpushare-cr-webhook)
#   GO                       go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../build-go-tool.sh" "$here" \
  "${GPUSHARE_CR_WEBHOOK_DIR:-$HOME/.cache/gpushare-cr-webhook}"
