#!/usr/bin/env bash
# Builds Kueue's manager (sigs.k8s.io/kueue/cmd/kueue, pinned in go.mod beside this script)
# and copies Kueue's CRDs from the same module into a content-addressed cache directory
# outside the repository, and prints that directory on the last line of stdout, as
# harness/build.sh does for the harness binary. harness/kueue.py runs the manager against
# the e2e control plane.
#
# A separate Go module (tool directive) so Kueue's dependency graph (client-go v0.35,
# controller-runtime, the job frameworks' APIs) never touches harness/go.mod; go.mod
# requires exactly what Kueue's own go.mod does (it has no replace directives). The cache
# key hashes go.mod, go.sum and this script: an unchanged pin is a cache hit (exit 0 at
# once), a new pin builds a new directory beside the old.
#
# The directory holds `kueue` (the manager), crds/*.yaml (config/components/crd/bases of
# the module: the CRDs without the conversion-webhook patches) and VERSION.
#
#   GPUSHARE_KUEUE_DIR  cache directory (default: $HOME/.cache/gpushare-kueue)
#   GO                  go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache_dir="${GPUSHARE_KUEUE_DIR:-$HOME/.cache/gpushare-kueue}"

version="$(sed -n 's|^[[:space:]]*sigs\.k8s\.io/kueue \(v[^ ]*\).*$|\1|p' go.mod | head -n1)"
if [ -z "$version" ]; then
  echo "build.sh: sigs.k8s.io/kueue not found in go.mod" >&2
  exit 1
fi

key="$(LC_ALL=C; cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
out="$cache_dir/$key"
if [ -x "$out/kueue" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_dir"
tmp="$(mktemp -d "$cache_dir/.$key.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
echo "build.sh: building kueue $version into $out" >&2
start=$SECONDS

# -mod=mod: go.sum already pins every module; nothing is vendored.
export GOFLAGS=-mod=mod GOWORK=off
# Kueue's Makefile stamps the version the same way (its build date is left out here, so
# the binary depends on the pin only). -s -w: no symbol tables, a faster link.
ldflags="-s -w -X sigs.k8s.io/kueue/pkg/version.GitVersion=$version"
CGO_ENABLED=0 "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$tmp/kueue" sigs.k8s.io/kueue/cmd/kueue

# The build downloaded the module: take the CRDs from the very same copy.
module_dir="$("$go_cmd" list -m -f '{{.Dir}}' sigs.k8s.io/kueue)"
[ -d "$module_dir/config/components/crd/bases" ] || {
  echo "build.sh: no config/components/crd/bases in $module_dir" >&2
  exit 1
}
# The module cache is read-only: give the copies ordinary modes.
install -d -m 0755 "$tmp/crds"
install -m 0644 "$module_dir"/config/components/crd/bases/*.yaml "$tmp/crds/"
echo "$version" >"$tmp/VERSION"
chmod 0755 "$tmp" "$tmp/kueue"

# Rename last, so an interrupted build never leaves a directory that looks like a cache hit;
# a concurrent build that got there first wins (the trap removes this one's copy).
if ! mv -T "$tmp" "$out" 2>/dev/null; then
  [ -x "$out/kueue" ] || {
    echo "build.sh: cannot move $tmp to $out" >&2
    exit 1
  }
fi
echo "build.sh: built in $((SECONDS - start))s" >&2
# Keep the three newest directories (about 100 MB each).
# shellcheck disable=SC2012 # names are 16 hex digits, so parsing ls is safe
ls -1dt "$cache_dir"/*/ | { grep -E '/[0-9a-f]{16}/$' || true; } | tail -n +4 | xargs -r rm -rf --
echo "$out"
