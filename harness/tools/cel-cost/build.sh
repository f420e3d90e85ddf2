#!/usr/bin/env bash
# Builds the admission-policy cost tool (bench/cel_cost.py) into a content-addressed cache
# outside the repository and prints the binary's path on the last line of stdout, like
# harness/build.sh (../build-go-tool.sh does it). k8s.io/apiserver's admission-policy code,
# from the module proxy at the harness's versions.
#
#   GPUSHARE_CEL_COST_DIR  cache directory (default: $HOME/.cache/gpushare-cel-cost)
#   GO                     go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../build-go-tool.sh" "$here" "${GPUSHARE_CEL_COST_DIR:-$HOME/.cache/gpushare-cel-cost}"
