#!/usr/bin/env bash
# Builds the Helm CLI (helm.sh/helm/v3, pinned in go.mod beside this script) into a
# content-addressed cache outside the repository and prints the binary's path on the last
# line of stdout, as harness/build.sh does for the control-plane harness. The chart tests
# (tests/test_helm_chart.py, tests/e2e/test_helm_chart.py) run `helm lint` and
# `helm template` with it.
#
# A separate Go module (tool directive, Go 1.24+) so Helm's dependency graph never touches
# harness/go.mod. The cache key hashes go.mod, go.sum and this script (its ldflags): an
# unchanged pin is a cache hit (exit 0 at once), a new pin builds a new file beside the old.
#
#   GPUSHARE_HELM_DIR  cache directory (default: $HOME/.cache/gpushare-helm)
#   GO                 go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache_dir="${GPUSHARE_HELM_DIR:-$HOME/.cache/gpushare-helm}"

helm_version="$(sed -n 's|^[[:space:]]*helm\.sh/helm/v3 \(v[^ ]*\).*$|\1|p' go.mod | head -n1)"
client_go="$(sed -n 's|^[[:space:]]*k8s\.io/client-go \(v[^ ]*\).*$|\1|p' go.mod | head -n1)"
if [ -z "$helm_version" ] || [ -z "$client_go" ]; then
  echo "build.sh: helm.sh/helm/v3 or k8s.io/client-go not found in go.mod" >&2
  exit 1
fi

key="$(LC_ALL=C; cat go.mod go.sum build.sh | sha256sum | cut -c1-16)"
out="$cache_dir/helm-$key"
if [ -x "$out" ]; then
  echo "$out"
  exit 0
fi

mkdir -p "$cache_dir"
tmp="$(mktemp "$cache_dir/.helm-$key.XXXXXX")"
trap 'rm -f "$tmp"' EXIT

# The ldflags of Helm's own Makefile: the release version (else `helm version` says
# "unreleased" and charts' kubeVersion checks see a v0 client), and the Kubernetes version
# `helm template` and `helm lint` assume without a cluster: client-go v0.X.Y is Kubernetes
# 1.X (the Makefile adds 1 to client-go's major).
minor="$(echo "${client_go#v}" | cut -d. -f2)"
ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
ldflags="$ldflags -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
  ldflags="$ldflags -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$minor"
done

echo "build.sh: building helm $helm_version (client-go $client_go) into $out" >&2
start=$SECONDS
CGO_ENABLED=0 "$go_cmd" build -trimpath -ldflags "$ldflags" -o "$tmp" helm.sh/helm/v3/cmd/helm
chmod 0755 "$tmp"
# Rename last, so an interrupted build never leaves a binary that looks like a cache hit.
mv -f "$tmp" "$out"
trap - EXIT
echo "build.sh: built in $((SECONDS - start))s" >&2
# Keep the three newest builds (about 60 MiB each).
# shellcheck disable=SC2012 # names are helm-<hex>, so parsing ls is safe
ls -1t "$cache_dir"/helm-* 2>/dev/null | tail -n +4 | xargs -r rm -f --
echo "$out"
