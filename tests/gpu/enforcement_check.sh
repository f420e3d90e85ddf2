#!/usr/bin/env bash
# The limits gpushare writes, on a real NVIDIA GPU: an allocation beyond the cap fails under
# each enforcement (docs/enforcement.md), and the node agent's NVML reads see what runs.
#   0. baseline: with no cap, the same allocation succeeds (so it is the cap that refuses it);
#   1. the node agent's readers, for real: NVML's driver version, and a running process on
#      NVML's process list with its memory (webhook.node.nvml.PynvmlNvml);
#   2. MPS pinned memory limit: a client of an MPS control daemon (started here, in its own
#      pipe directory) with CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=<cap>M, as the webhook writes
#      it, gets an allocation under the cap and is refused one above it; NVML lists it as an
#      MPS client (what the node agent's audit relies on);
#   3. driver memory limit: NVML's nvmlDeviceSetMemoryLimits_v1 on a cgroup of its own, the
#      call the toolkit's apply-cuda-memory-limits hook makes on a container's cgroup; a
#      process in that cgroup is refused an allocation above the hard limit and sees the
#      limit as cuMemGetInfo's total. SKIPPED, with the reason, where the driver is older
#      than R615, the host is not cgroup v2, or cgroups cannot be made here (not root, a
#      read-only /sys/fs/cgroup); whether the toolkit's hook is installed is reported.
# Leaves the GPU as it found it: no compute-mode or MIG change; the MPS daemon is quit, the
# cgroup's limits cleared and the cgroup removed on exit. Prints a summary; exits 1 if a
# check failed, 0 if every check passed or was skipped. Takes about half a minute.
#
# Needs: an NVIDIA GPU (Volta or newer, MIG off), nvidia-smi, nvidia-cuda-mps-control for
# step 2, and python with gpushare and nvidia-ml-py (GPUSHARE_PYTHON, default .venv/bin/python).
# tests/gpu/test_gpu_checks.py runs it when GPUSHARE_GPU_CHECKS=1.
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${GPUSHARE_PYTHON:-$repo/.venv/bin/python}"
work="$(mktemp -d /tmp/gpushare-enforcement-check.XXXXXX)"
pipe="$work/pipe"
cgroup=""
cap_mib="${GPUSHARE_CAP_MIB:-4096}"
over_mib=$(( cap_mib + 2048 ))
under_mib=$(( cap_mib / 2 ))
declare -a results=()
failed=0

check() { # check NAME EXIT-CODE DETAIL
  if [ "$2" -eq 0 ]; then results+=("PASS  $1: $3"); else results+=("FAIL  $1: $3"); failed=1; fi
}
skip() { results+=("SKIP  $1: $2"); }

# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  if [ -S "$pipe/control" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 10 nvidia-cuda-mps-control >/dev/null 2>&1
  fi
  if [ -n "$cgroup" ] && [ -d "$cgroup" ]; then
    driver_limit clear "$cgroup" >/dev/null 2>&1
    rmdir "$cgroup" 2>/dev/null
  fi
}
trap cleanup EXIT

client() { # client OUT-NAME [env assignments...]: memory_client.py under the given env
  local name="$1"; shift
  env "$@" "$python" "$here/memory_client.py" --over-mib "$over_mib" --under-mib "$under_mib" \
    "${client_flags[@]}" >"$work/$name.json" 2>"$work/$name.err"
}
client_flags=()

field() { "$python" -c 'import json,sys; print(json.load(open(sys.argv[1])).get(sys.argv[2]))' "$@"; }

for tool in nvidia-smi "$python"; do
  command -v "$tool" >/dev/null || { echo "enforcement_check: $tool not found" >&2; exit 2; }
done
nvidia-smi --query-gpu=index,name,memory.total,driver_version,compute_mode,mig.mode.current --format=csv
memory_mib="$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')"
echo "GPU 0: ${memory_mib} MiB; cap ${cap_mib} MiB, allocations of ${under_mib} and ${over_mib} MiB"

# 0. No cap: the allocation above the cap is granted.
client baseline
[ "$(field "$work/baseline.json" over_refused)" = "False" ]
check "no cap: ${over_mib} MiB granted" $? "$(cat "$work/baseline.json") $(head -c 300 "$work/baseline.err")"

# 1. The node agent's NVML reads on this GPU, with a process holding memory.
client_flags=(--ready-file "$work/held" --hold-s 6)
client held &
held_pid=$!
for _ in $(seq 1 40); do [ -f "$work/held" ] && break; sleep 0.25; done
seen="$(cd "$repo" && "$python" - "$held_pid" <<'EOF'
import sys
from webhook.node.nvml import PynvmlNvml
nvml = PynvmlNvml()
nvml.init()
pid = int(sys.argv[1])
found = [p for p in nvml.processes(0) if p.pid == pid]
print(f"driver {nvml.driver_version()}; pid {pid}: {found}")
nvml.shutdown()
sys.exit(0 if found and (found[0].used_bytes or 0) >= 1 << 20 else 1)
EOF
)"
check "NVML lists the process and its memory" $? "$seen"
wait "$held_pid"
client_flags=()

# 2. MPS pinned memory limit.
if command -v nvidia-cuda-mps-control >/dev/null; then
  mkdir -p "$pipe" "$work/mps-log"
  CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_LOG_DIRECTORY="$work/mps-log" nvidia-cuda-mps-control -d
  sleep 1
  client_flags=(--ready-file "$work/mps-held" --hold-s 6)
  client mps CUDA_MPS_PIPE_DIRECTORY="$pipe" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${cap_mib}M" &
  mps_pid=$!
  for _ in $(seq 1 60); do [ -f "$work/mps-held" ] && break; sleep 0.25; done
  listed="$(cd "$repo" && "$python" - "$mps_pid" <<'EOF'
import sys
from webhook.node.nvml import PynvmlNvml
nvml = PynvmlNvml()
nvml.init()
pid = int(sys.argv[1])
everything = nvml.processes(0)
print(f"pid {pid}; NVML: {everything}")
nvml.shutdown()
sys.exit(0 if any(p.pid == pid and p.mps_client for p in everything) else 1)
EOF
)"
  check "NVML lists the MPS client as one" $? "$listed"
  wait "$mps_pid"
  client_flags=()
  [ "$(field "$work/mps.json" over_refused)" = "True" ] && [ "$(field "$work/mps.json" under_ok)" = "True" ]
  check "MPS pinned limit holds" $? "$(cat "$work/mps.json") $(head -c 300 "$work/mps.err")"
  echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 10 nvidia-cuda-mps-control
else
  skip "MPS pinned limit" "nvidia-cuda-mps-control is not installed"
fi

# 3. Driver memory limit, through the NVML call the toolkit's hook makes.
driver_limit() { # driver_limit set|clear CGROUP-DIR
  "$python" - "$1" "$2" "$cap_mib" <<'EOF'
import sys
import pynvml
action, cgroup, cap = sys.argv[1], sys.argv[2], int(sys.argv[3]) << 20
pynvml.nvmlInit()
device = pynvml.nvmlDeviceGetHandleByIndex(0)
limits = pynvml.c_nvmlSetMemoryLimits_v1_t()
limits.nameSpace = cgroup.encode()
# To clear: soft 0 and hard NVML_DEVICE_MEMORY_LIMIT_MAX (nvml.h, nvmlDeviceSetMemoryLimits_v1).
limits.softLimit = cap if action == "set" else 0
limits.hardLimit = cap if action == "set" else pynvml.NVML_DEVICE_MEMORY_LIMIT_MAX
pynvml.nvmlDeviceSetMemoryLimits_v1(device, limits)
print(f"{action}: {cgroup}")
EOF
}
driver="$(nvidia-smi -i 0 --query-gpu=driver_version --format=csv,noheader | tr -d ' ')"
hook="none"
for binary in nvidia-cdi-hook nvidia-ctk; do
  if command -v "$binary" >/dev/null; then
    args=(apply-cuda-memory-limits --help); [ "$binary" = nvidia-ctk ] && args=(hook "${args[@]}")
    "$binary" "${args[@]}" >/dev/null 2>&1 && hook="$binary ${args[*]% --help}" && break
  fi
done
echo "driver ${driver}; toolkit hook: ${hook}"
if [ "${driver%%.*}" -lt 615 ] 2>/dev/null; then
  skip "driver memory limit" "driver ${driver} is older than R615, which nvmlDeviceSetMemoryLimits_v1 needs (toolkit hook: ${hook})"
elif [ ! -f /sys/fs/cgroup/cgroup.controllers ]; then
  skip "driver memory limit" "/sys/fs/cgroup is not cgroup v2 (the toolkit's hook refuses v1)"
elif ! mkdir "/sys/fs/cgroup/gpushare-check-$$" 2>/dev/null; then
  skip "driver memory limit" "cannot create a cgroup under /sys/fs/cgroup (root and a writable cgroup2 mount are needed)"
else
  cgroup="/sys/fs/cgroup/gpushare-check-$$"
  if ! setting="$(driver_limit set "$cgroup" 2>&1)"; then
    check "driver memory limit set" 1 "$setting"
  else
    sh -c 'echo $$ >"$1/cgroup.procs" && shift && exec "$@"' sh "$cgroup" \
      "$python" "$here/memory_client.py" --over-mib "$over_mib" --under-mib "$under_mib" \
      >"$work/driver.json" 2>"$work/driver.err"
    total="$(field "$work/driver.json" total_mib)"
    [ "$(field "$work/driver.json" over_refused)" = "True" ] \
      && [ "$(field "$work/driver.json" under_ok)" = "True" ]
    check "driver memory limit holds" $? "$(cat "$work/driver.json") $(head -c 300 "$work/driver.err")"
    [ "$total" -le "$cap_mib" ] 2>/dev/null
    check "cuMemGetInfo reports the limit" $? "total ${total} MiB under a ${cap_mib} MiB hard limit"
  fi
fi

echo
echo "== gpushare enforcement check: $(nvidia-smi -i 0 --query-gpu=name,driver_version --format=csv,noheader)"
printf '%s\n' "${results[@]}"
echo "(work directory: $work)"
exit $failed
