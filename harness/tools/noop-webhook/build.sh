#!/usr/bin/env bash
# Builds the no-op admission webhook (bench/e2e_bench.py's floor) into a content-addressed
# cache outside the repository and prints the binary's path on the last line of stdout, like
# harness/build.sh (../build-go-tool.sh does it). Standard library only: no module download.
#
#   GPUSHARE_NOOP_WEBHOOK_DIR  cache directory (default: $HOME/.cache/gpushare-noop-webhook)
#   GO                         go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
exec "$here/../build-go-tool.sh" "$here" \
  "${GPUSHARE_NOOP_WEBHOOK_DIR:-$HOME/.cache/gpushare-noop-webhook}"
