#!/usr/bin/env bash
# Regenerates the k8s.io staging-module `replace` lines in go.mod from the Kubernetes
# release's own go.mod, then tidies. k8s.io/kubernetes requires every staging module at
# v0.0.0 and resolves them with ./staging replaces that do not apply to a consumer, so a
# consumer must pin each one to the matching v0.X.Y tag itself.
#
# Usage: harness/gen-replaces.sh [KUBERNETES_VERSION]   (default: the one in go.mod)
set -euo pipefail
cd "$(dirname "$0")"
export PATH="$PATH:/usr/local/go/bin"

k8s_version="${1:-$(go mod edit -json | python3 -c '
import json, sys
mods = json.load(sys.stdin)["Require"]
print(next(m["Version"] for m in mods if m["Path"] == "k8s.io/kubernetes"))')}"
staging_version="v0.${k8s_version#v1.}"

gomod="$(go mod download -json "k8s.io/kubernetes@${k8s_version}" \
  | python3 -c 'import json, sys; print(json.load(sys.stdin)["GoMod"])')"

# The release's replace block names every staging module as `k8s.io/X => ./staging/src/k8s.io/X`.
mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s\.io/[^ ]*\) => \./staging/src/.*$|\1|p' "$gomod" | sort -u)
if [ "${#staging[@]}" -eq 0 ]; then
  echo "no staging replaces found in $gomod" >&2
  exit 1
fi

# Drop any k8s.io replace we generated before, so a version bump leaves no stale line.
for old in $(go mod edit -json | python3 -c '
import json, sys
for r in json.load(sys.stdin).get("Replace") or []:
    if r["Old"]["Path"].startswith("k8s.io/"):
        print(r["Old"]["Path"])'); do
  go mod edit -dropreplace="$old"
done

args=()
for m in "${staging[@]}"; do
  args+=("-replace=${m}=${m}@${staging_version}")
done
go mod edit -require="k8s.io/kubernetes@${k8s_version}" "${args[@]}"
go mod tidy
echo "pinned ${#staging[@]} staging modules to ${staging_version} for k8s.io/kubernetes ${k8s_version}" >&2
