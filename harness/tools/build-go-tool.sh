#!/usr/bin/env bash
# Builds the Go tool in directory $1 (a module of its own: go.mod, go.sum if it has
# dependencies, *.go, and the build.sh that calls this) into the content-addressed cache
# directory $2, and prints the binary's path on the last line of stdout, like
# harness/build.sh. The cache key hashes those files and this script: unchanged sources
# are a cache hit (exit 0 at once), changed ones build a new file beside the old.
# Used by tools/noop-webhook and tools/cel-cost (Helm's build needs ldflags of its own).
#
#   GO  go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
self="$(cd "$(dirname "$0")" && pwd)/$(basename "$0")"
tool_dir="$(cd "$1" && pwd)"
cache_dir="$2"
name="$(basename "$tool_dir")"
cd "$tool_dir"
go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
inputs=(go.mod)
[ -f go.sum ] && inputs+=(go.sum)
key="$(LC_ALL=C; cat "${inputs[@]}" ./*.go build.sh "$self" | sha256sum | cut -c1-16)"
out="$cache_dir/$name-$key"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi
mkdir -p "$cache_dir"
tmp="$(mktemp "$cache_dir/.$name-$key.XXXXXX")"
trap 'rm -f "$tmp"' EXIT
CGO_ENABLED=0 GOFLAGS=-mod=mod "$go_cmd" build -trimpath -ldflags "-s -w" -o "$tmp" .
chmod +x "$tmp"
mv "$tmp" "$out"
trap - EXIT
echo "$out"
