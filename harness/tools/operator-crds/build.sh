#!/usr/bin/env bash
# Gathers the custom resource definitions and published example manifests of GPU operators
# (KubeRay, Kubeflow Training Operator and Trainer, Argo Workflows, JobSet, LeaderWorkerSet,
# KServe) from the projects' own Go modules, pinned in modules.txt beside this script, into
# a content-addressed cache directory outside the repository, and prints that directory on
# the last line of stdout, as harness/build.sh does for the harness binary.
#
# `go mod download` fetches each module@version into the Go module cache through the module
# proxy (GOPROXY), which checks it against sum.golang.org; this script then checks the h1:
# sum pinned in modules.txt. Only files are read from the modules: nothing is built or run.
# CRDs of ours (`local` blocks: minimal/, for operators whose modules the proxy does not
# serve) are copied beside them.
#
# The directory holds, for each project, <project>/crds/<file> and <project>/samples/<path
# inside the module>, plus index.tsv (project, crd|sample, path in the directory, source)
# and a copy of modules.txt. The cache key hashes modules.txt, minimal/ and this script, so
# an unchanged pin is a cache hit (exit 0 at once, no network) and a new pin builds a new
# directory beside the old.
#
#   GPUSHARE_OPERATOR_CRDS_DIR  cache directory (default: $HOME/.cache/gpushare-operator-crds)
#   GO                          go command (default: go on PATH, else /usr/local/go/bin/go)
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

go_cmd="${GO:-$(command -v go || echo /usr/local/go/bin/go)}"
cache_dir="${GPUSHARE_OPERATOR_CRDS_DIR:-$HOME/.cache/gpushare-operator-crds}"
pins="$here/modules.txt"

# C collation: the file order, and so the key, must not depend on the caller's locale.
key="$(
  export LC_ALL=C
  { cat modules.txt build.sh; find minimal -type f | sort | xargs -r cat; } | sha256sum | cut -c1-16
)"
out="$cache_dir/$key"
if [ -f "$out/index.tsv" ]; then
  echo "$out"
  exit 0
fi

fail() {
  echo "build.sh: $*" >&2
  exit 1
}
[ -x "$go_cmd" ] || command -v "$go_cmd" >/dev/null || fail "no go command ($go_cmd); set GO"

mkdir -p "$cache_dir"
tmp="$(mktemp -d "$cache_dir/.$key.XXXXXX")"
scratch="$(mktemp -d)"
trap 'rm -rf "$tmp" "$scratch"' EXIT
echo "build.sh: gathering operator CRDs into $out" >&2
start=$SECONDS

# download MODULE VERSION SUM: prints the module's directory in the module cache. Run in an
# empty directory (no go.mod above it, no workspace), so no module's go.mod is touched.
download() {
  local module="$1" version="$2" sum="$3" json dir got error
  if ! json="$(cd "$scratch" && GOWORK=off GOFLAGS=-mod=mod "$go_cmd" mod download -json "$module@$version" 2>&1)"; then
    error="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Error": "\(.*\)",\{0,1\}$/\1/p')"
    # The JSON string escapes quotes, newlines and tabs: turn them back.
    error="$(printf '%b' "${error:-$json}" | sed 's/\\"/"/g')"
    fail "cannot download $module@$version with go mod download (GOPROXY=$("$go_cmd" env GOPROXY)):
  $error
If this machine cannot reach the proxy, fill its Go module cache
($("$go_cmd" env GOMODCACHE)) from one that can (go mod download $module@$version
there, then copy the cache): a module already in the cache is used without network.
A 403 \"not available\" is the proxy's answer for a version it does not serve: check
the version in modules.txt."
  fi
  dir="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')"
  got="$(printf '%s\n' "$json" | sed -n 's/^[[:space:]]*"Sum": "\(.*\)",\{0,1\}$/\1/p')"
  [ -n "$dir" ] && [ -d "$dir" ] || fail "go mod download $module@$version printed no directory:
$json"
  [ "$got" = "$sum" ] || fail "$module@$version has sum $got, but modules.txt pins $sum"
  echo "$dir"
}

# copy PROJECT KIND SOURCE_ROOT PATH SOURCE_NAME
copy() {
  local project="$1" kind="$2" root="$3" path="$4" source="$5" dest
  case "$path" in
    /* | *..*) fail "modules.txt: $project: $path must be a relative path without .." ;;
  esac
  if [ ! -f "$root/$path" ]; then
    fail "$project: $path is not in $source (module zips leave out some directories, e.g. nested modules and vendor/; pick a path that exists in $root)"
  fi
  if [ "$kind" = crd ]; then
    dest="$project/crds/$(basename "$path")"
  else
    dest="$project/samples/$path"
  fi
  [ ! -e "$tmp/$dest" ] || fail "$project: two files would be copied to $dest"
  # The module cache is read-only: give the copies ordinary modes.
  install -D -m 0644 "$root/$path" "$tmp/$dest"
  printf '%s\t%s\t%s\t%s\n' "$project" "$kind" "$dest" "$source/$path" >>"$tmp/index.tsv"
}

project="" root="" source="" line_no=0
declare -A seen=()
: >"$tmp/index.tsv"
while read -r word a b c d extra || [ -n "$word" ]; do
  line_no=$((line_no + 1))
  case "$word" in
    "" | "#"*) continue ;;
  esac
  where="modules.txt:$line_no"
  case "$word" in
    module)
      [ -n "$d" ] && [ -z "$extra" ] || fail "$where: want: module PROJECT MODULE VERSION SUM"
      project="$a"
      echo "build.sh: $b@$c" >&2
      root="$(download "$b" "$c" "$d")"
      source="$b@$c"
      ;;
    local)
      [ -n "$a" ] && [ -z "$b" ] || fail "$where: want: local PROJECT"
      project="$a" root="$here" source="harness/tools/operator-crds"
      ;;
    crd | sample)
      [ -n "$a" ] && [ -z "$b" ] || fail "$where: want: $word PATH"
      [ -n "$project" ] || fail "$where: $word before any module or local line"
      copy "$project" "$word" "$root" "$a" "$source"
      continue
      ;;
    *) fail "$where: unknown directive $word" ;;
  esac
  case "$project" in
    "" | *[!a-z0-9-]*) fail "$where: project names are lower-case letters, digits and -" ;;
  esac
  [ -z "${seen[$project]:-}" ] || fail "$where: project $project appears twice"
  seen[$project]=1
done <"$pins"
[ -s "$tmp/index.tsv" ] || fail "modules.txt names no files"
cp "$pins" "$tmp/modules.txt"
chmod 0755 "$tmp"

# Rename last, so an interrupted build never leaves a directory that looks like a cache hit;
# a concurrent build that got there first wins (the trap removes this one's copy).
if ! mv -T "$tmp" "$out" 2>/dev/null; then
  [ -f "$out/index.tsv" ] || fail "cannot move $tmp to $out"
fi
echo "build.sh: gathered $(wc -l <"$out/index.tsv") files in $((SECONDS - start))s" >&2
# Keep the three newest directories (about 20 MB each).
# shellcheck disable=SC2012 # names are 16 hex digits, so parsing ls is safe
ls -1dt "$cache_dir"/*/ | { grep -E '/[0-9a-f]{16}/$' || true; } | tail -n +4 | xargs -r rm -rf --
echo "$out"
