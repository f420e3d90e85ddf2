#!/usr/bin/env bash
# The node side on a real NVIDIA GPU, once: start `gpushare mps-daemon` for real, run two
# MPS clients with the limits the webhook injects for gpu-fraction 0.25 (one slot of a
# 4-replica pool), and check that
#   1. the launcher started nvidia-cuda-mps-control with the pool's defaults (25 %, M/4 MiB);
#   2. each client gets at most its pinned memory limit: one allocation above it is refused,
#      step-wise allocation stops near it;
#   3. each client's kernel runs on about 25 % of the SMs, not all of them;
#   4. a client with no MPS env at all is still held to the daemon's defaults;
#   5. both clients are served by one MPS server at the same time;
#   6. on SIGTERM the launcher quits the daemon, exits 0 and restores the compute mode.
# Prints a summary; exits 1 if any check failed. Takes about a minute.
#
# Needs: an NVIDIA GPU (Volta or newer, MIG off), the driver with nvidia-smi and
# nvidia-cuda-mps-control, and this repository's venv (.venv, `pip install -e .`). Run as
# root to test EXCLUSIVE_PROCESS (otherwise the launcher runs degraded and says so). No
# Kubernetes is needed: the launcher is pointed at an unreachable apiserver, so labelling
# fails (logged, retried) while everything else runs for real.
#
#   GPUSHARE_PYTHON  python with gpushare installed (default: .venv/bin/python)
set -uo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
python="${GPUSHARE_PYTHON:-$repo/.venv/bin/python}"
work="$(mktemp -d /tmp/gpushare-gpu-check.XXXXXX)"
pipe="$work/pipe"
logdir="$work/log"
launcher_log="$work/launcher.log"
replicas=4
launcher_pid=""
declare -a results=()
failed=0

check() { # check NAME CONDITION-EXIT-CODE DETAIL
  if [ "$2" -eq 0 ]; then results+=("PASS  $1: $3"); else results+=("FAIL  $1: $3"); failed=1; fi
}

# shellcheck disable=SC2317  # called through the EXIT trap
cleanup() {
  if [ -n "$launcher_pid" ] && kill -0 "$launcher_pid" 2>/dev/null; then
    kill -TERM "$launcher_pid"; sleep 5; kill -KILL "$launcher_pid" 2>/dev/null
  fi
  if [ -S "$pipe/control" ] || [ -f "$pipe/nvidia-cuda-mps-control.pid" ]; then
    echo quit | CUDA_MPS_PIPE_DIRECTORY="$pipe" nvidia-cuda-mps-control >/dev/null 2>&1
  fi
}
trap cleanup EXIT

control() { echo "$1" | CUDA_MPS_PIPE_DIRECTORY="$pipe" timeout 10 nvidia-cuda-mps-control; }

for tool in nvidia-smi nvidia-cuda-mps-control "$python"; do
  command -v "$tool" >/dev/null || { echo "real_mps_check: $tool not found" >&2; exit 2; }
done
nvidia-smi --query-gpu=index,name,memory.total,compute_mode,mig.mode.current --format=csv
memory_mib="$(nvidia-smi -i 0 --query-gpu=memory.total --format=csv,noheader,nounits | tr -d ' ')"
mode_before="$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)"
slot_mib=$(( memory_mib / replicas ))
threads=$(( 100 / replicas ))
echo "GPU 0: ${memory_mib} MiB, compute mode ${mode_before}; one slot: ${threads} % and ${slot_mib} MiB"

cat >"$work/policy.yaml" <<EOF
apiVersion: gpushare.io/v1alpha1
kind: GpuSharingPolicy
metadata:
  name: gpu-check
spec:
  default: true
  mode: mps-daemon
  gpuMemory: ${memory_mib}Mi
  pools:
    - name: gpu-check
      replicas: ${replicas}
  mpsDaemon:
    pipeDirectory: ${pipe}
    logDirectory: ${logdir}
EOF
cat >"$work/kubeconfig" <<'EOF'
apiVersion: v1
kind: Config
clusters: [{name: none, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: none, user: {token: none}}]
contexts: [{name: none, context: {cluster: none, user: none}}]
current-context: none
EOF

# 1. The launcher, for real.
(cd "$repo" && exec "$python" -m webhook.cli mps-daemon --policies "$work/policy.yaml" \
  --pool gpu-check --node-name gpu-check-node --kubeconfig "$work/kubeconfig" \
  --listen 127.0.0.1:0 --check-interval 1) 2>"$launcher_log" &
launcher_pid=$!
started=1
for _ in $(seq 1 60); do
  if grep -q '"event":"daemon_started"' "$launcher_log"; then started=0; break; fi
  if ! kill -0 "$launcher_pid" 2>/dev/null; then break; fi
  sleep 1
done
check "launcher started the daemon" $started "$(grep -o '"event":"[a-z_]*"' "$launcher_log" | tr '\n' ' ')"
if [ $started -ne 0 ]; then cat "$launcher_log"; printf '%s\n' "${results[@]}"; exit 1; fi
daemon_threads="$(control get_default_active_thread_percentage | tr -d ' \n')"
[ "${daemon_threads%.*}" = "$threads" ]; check "daemon thread default" $? "daemon reports ${daemon_threads}, want ${threads}"
grep -q "compute_mode_degraded" "$launcher_log"; degraded=$?
mode_during="$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)"
echo "compute mode while serving: ${mode_during} (degraded event: $([ $degraded -eq 0 ] && echo yes || echo no))"

# 2-5. Two clients with the webhook's env, at the same time, and one with no env.
over=$(( slot_mib + 1024 ))
run_client() { # name, then env assignments
  local name="$1"; shift
  env CUDA_MPS_PIPE_DIRECTORY="$pipe" "$@" "$python" "$here/mps_client.py" --over-mib "$over" \
    --hold-s 4 >"$work/$name.json" 2>"$work/$name.err"
}
run_client a CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$threads" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${slot_mib}M" &
client_a=$!
run_client b CUDA_MPS_ACTIVE_THREAD_PERCENTAGE="$threads" CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=${slot_mib}M" &
client_b=$!
sleep 2
servers="$(control get_server_list | tr '\n' ' ')"
clients=0
for server in $servers; do
  clients=$(( clients + $(control "get_client_list $server" | grep -c '[0-9]') ))
done
wait $client_a; wait $client_b
[ "$(echo "$servers" | wc -w)" -eq 1 ] && [ "$clients" -ge 2 ]
check "one MPS server, both clients" $? "servers: ${servers:-none}; clients seen: ${clients}"
run_client bare

evaluate() { # name
  "$python" - "$work/$1.json" "$slot_mib" "$threads" <<'EOF'
import json, math, sys
data = json.load(open(sys.argv[1]))
slot, pct = int(sys.argv[2]), int(sys.argv[3])
if "error" in data:
    print(f"client error: {data['error']}"); sys.exit(1)
allowed = math.ceil(data["total_sms"] * pct / 100) + 2  # MPS rounds to whole TPCs (2 SMs)
ok_memory = data["over_limit_refused"] and slot * 0.5 <= data["allocated_mib"] <= slot
ok_threads = 0 < data["used_sms"] <= allowed < data["total_sms"]
print(f"memory: {data['allocated_mib']} MiB of a {slot} MiB limit, one {slot + 1024} MiB "
      f"allocation {'refused (' + str(data['over_limit_error']) + ')' if data['over_limit_refused'] else 'ALLOWED'}; "
      f"SMs: used {data['used_sms']} of {data['total_sms']} (allowed {allowed}, exec affinity "
      f"{data['affinity_sms']})")
sys.exit(0 if ok_memory and ok_threads else 1)
EOF
}
for name in a b bare; do
  detail="$(evaluate $name 2>&1)"; status=$?
  [ -s "$work/$name.err" ] && detail="$detail; stderr: $(head -c 300 "$work/$name.err")"
  check "client $name limits" $status "$detail"
done

# 6. SIGTERM: quit, exit 0, compute mode back.
kill -TERM "$launcher_pid"
code=0; wait "$launcher_pid" || code=$?
launcher_pid=""
[ $code -eq 0 ] || grep -q '"label_removed":false' "$launcher_log"
check "launcher stopped on SIGTERM" $? "exit ${code} (1 means only that the unreachable apiserver kept the label from being removed)"
grep -q '"event":"daemon_quit"' "$launcher_log" && ! pgrep -f "nvidia-cuda-mps-control -d" >/dev/null
check "daemon quit" $? "daemon_quit event and no nvidia-cuda-mps-control -d left"
mode_after="$(nvidia-smi -i 0 --query-gpu=compute_mode --format=csv,noheader)"
[ "$mode_after" = "$mode_before" ]; check "compute mode restored" $? "${mode_before} -> ${mode_during} -> ${mode_after}"

echo
echo "== gpushare real MPS check: $(nvidia-smi -i 0 --query-gpu=name,driver_version --format=csv,noheader)"
printf '%s\n' "${results[@]}"
echo "(work directory: $work; launcher log: $launcher_log)"
exit $failed
