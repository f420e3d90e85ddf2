#!/usr/bin/env bash
# Builds the CEL cost tool (bench/cel_cost.py) into a content-addressed
# cache outside the repository and prints the binary's path on the last line of stdout, like
# harness/build.sh. k8s.io/apiserver's admission-policy code, from the module proxy (the harness's versions).
#
#   GPUSHARE_CEL_COST_DIR  cache directory (default: $HOME/.cache/gpushare-cel-cost)
#   GO                         go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"
go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache_dir="${GPUSHARE_CEL_COST_DIR:-$HOME/.cache/gpushare-cel-cost}"
key="$(LC_ALL=C; cat go.mod go.sum ./*.go build.sh | sha256sum | cut -c1-16)"
out="$cache_dir/cel-cost-$key"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache_dir"
tmp="$(mktemp "$cache_dir/.cel-cost-$key.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
CGO_ENABLED=0 GOFLAGS=-mod=mod "$go_cmd" build -trimpath -ldflags "-s -w" -o "$tmp" .
chmod +x "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
