#!/usr/bin/env bash
# Builds the e2e control-plane harness (etcd, kube-apiserver, kube-scheduler, kubectl in
# one static binary) into a content-addressed cache outside the repository, and prints
# the binary's path on the last line of stdout.
#
# The cache key hashes go.mod, go.sum, the Go sources and this script (its ldflags), so
# an unchanged harness is a cache hit (exit 0 at once) and any change builds a new file
# beside the old one.
#
#   GPUSHARE_HARNESS_DIR  cache directory (default: $HOME/.cache/gpushare-harness)
#   GO                    go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache_dir="${GPUSHARE_HARNESS_DIR:-$HOME/.cache/gpushare-harness}"

# The Kubernetes version comes from go.mod, so the binary reports the version it is.
k8s_version="$(sed -n 's|^[[:space:]]*k8s\.io/kubernetes \(v[^ ]*\).*$|\1|p' go.mod | head -n1)"
if [ -z "$k8s_version" ]; then
  echo "build.sh: k8s.io/kubernetes not found in go.mod" >&2
  exit 1
fi

# C collation: the glob's order, and so the key, must not depend on the caller's locale.
key="$(LC_ALL=C; cat go.mod go.sum ./*.go build.sh | sha256sum | cut -c1-16)"
out="$cache_dir/harness-$key"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_dir"
tmp="$(mktemp "$cache_dir/.harness-$key.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

# -s -w: no symbol/DWARF tables (about a third of the size). The -X flags replace the
# v0.0.0-master a plain go build reports, which kubectl's version-skew check and the
# apiserver's /version would otherwise show.
# Both packages carry the version, as in Kubernetes' hack/lib/version.sh: component-base
# for the servers and kubectl, client-go for the User-Agent of every client.
major="$(echo "${k8s_version#v}" | cut -d. -f1)"
minor="$(echo "${k8s_version#v}" | cut -d. -f2)"
ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  # gitCommit is unknown for a module build; empty beats the "$Format:%H$" placeholder.
  ldflags="$ldflags -X $pkg.gitVersion=$k8s_version -X $pkg.gitTreeState=clean -X $pkg.gitCommit="
  ldflags="$ldflags -X $pkg.gitMajor=$major -X $pkg.gitMinor=$minor"
done

echo "build.sh: building harness for Kubernetes $k8s_version into $out" >&2
start=$SECONDS
CGO_ENABLED=0 "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$tmp" .
chmod 0755 "$tmp"
# Rename last, so an interrupted build never leaves a binary that looks like a cache hit.
mv -f "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $((SECONDS - start))s" >&2
# Each binary is ~130 MiB: keep only the three newest, so edits do not fill the disk and a
# session still running an older build keeps its file for a while.
# shellcheck disable=SC2012 # names are harness-<hex>, so parsing ls is safe
ls -1t "$cache_dir"/harness-* 2>/dev/null | tail -n +4 | xargs -r rm -f --
echo "$out"
