"""One MPS client for tests/gpu/real_mps_check.sh: measures what its MPS limits let it do.

Only the CUDA driver (libcuda.so.1, present wherever the NVIDIA driver is) is needed, through
ctypes: no nvcc, torch or cupy. It prints one JSON object:

* ``total_sms``: the GPU's multiprocessor count (CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
* ``affinity_sms``: the SM count of the context's execution affinity (cuCtxGetExecAffinity,
  CUDA 11.4+), which reflects an MPS active thread percentage; null where unsupported;
* ``used_sms``: how many distinct SMs ran the blocks of a kernel launched with 8 blocks per
  SM that spin for a while and record ``%smid`` (a hand-written PTX kernel, JIT-compiled by
  the driver), i.e. how much of the GPU the client really got;
* ``allocated_mib``: device memory obtained in 256 MiB steps until cuMemAlloc refused;
* ``over_limit_refused`` / ``over_limit_error``: whether one allocation of
  ``--over-mib`` MiB was refused, and with which CUDA error.

Usage: python mps_client.py --over-mib N [--hold-s S]. The MPS limits come from the
environment (CUDA_MPS_PIPE_DIRECTORY, CUDA_MPS_ACTIVE_THREAD_PERCENTAGE,
CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), exactly as the webhook injects them into a pod.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time

CUDA_SUCCESS = 0
CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16
CU_EXEC_AFFINITY_TYPE_SM_COUNT = 0
STEP = 256 * 1024 * 1024
BLOCKS_PER_SM = 8

# record_smid(out, cycles): every block spins for `cycles` clock ticks (so blocks pile up
# on every SM the client may use), then thread 0 stores the block's SM id in out[block].
PTX = b"""
.version 7.0
.target sm_70
.address_size 64

.visible .entry record_smid(
    .param .u64 out,
    .param .u64 cycles
)
{
    .reg .pred %p<3>;
    .reg .b32 %r<4>;
    .reg .b64 %rd<9>;

    ld.param.u64 %rd1, [out];
    ld.param.u64 %rd2, [cycles];
    mov.u64 %rd3, %clock64;
SPIN:
    mov.u64 %rd4, %clock64;
    sub.s64 %rd5, %rd4, %rd3;
    setp.lt.s64 %p1, %rd5, %rd2;
    @%p1 bra SPIN;
    mov.u32 %r1, %tid.x;
    setp.ne.s32 %p2, %r1, 0;
    @%p2 bra DONE;
    mov.u32 %r2, %ctaid.x;
    mov.u32 %r3, %smid;
    cvta.to.global.u64 %rd6, %rd1;
    mul.wide.u32 %rd7, %r2, 4;
    add.s64 %rd8, %rd6, %rd7;
    st.global.u32 [%rd8], %r3;
DONE:
    ret;
}
"""


class ExecAffinityParam(ctypes.Structure):
    _fields_ = (("type", ctypes.c_int), ("value", ctypes.c_uint))


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def error_name(self, code: int) -> str:
        text = ctypes.c_char_p()
        self.lib.cuGetErrorName(code, ctypes.byref(text))
        return (text.value or b"?").decode()


class CudaError(Exception):
    def __init__(self, call: str, code: int, name: str) -> None:
        super().__init__(f"{call} failed: {name} ({code})")
        self.code = code
        self.name = name


def measure(over_mib: int, hold_s: float) -> dict[str, object]:
    cuda = Cuda()
    cuda.call("cuInit", 0)
    device = ctypes.c_int()
    cuda.call("cuDeviceGet", ctypes.byref(device), 0)
    context = ctypes.c_void_p()
    cuda.call("cuCtxCreate_v2", ctypes.byref(context), 0, device)
    sms = ctypes.c_int()
    cuda.call(
        "cuDeviceGetAttribute", ctypes.byref(sms), CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, device
    )
    result: dict[str, object] = {"total_sms": sms.value}

    affinity = ExecAffinityParam()
    try:
        cuda.call("cuCtxGetExecAffinity", ctypes.byref(affinity), CU_EXEC_AFFINITY_TYPE_SM_COUNT)
        result["affinity_sms"] = affinity.value
    except (CudaError, AttributeError):
        result["affinity_sms"] = None

    result["used_sms"] = used_sms(cuda, sms.value)

    # One allocation above the limit must be refused...
    pointer = ctypes.c_uint64()
    try:
        cuda.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(over_mib * 1024 * 1024))
        cuda.call("cuMemFree_v2", pointer)
        result["over_limit_refused"] = False
        result["over_limit_error"] = None
    except CudaError as exc:
        result["over_limit_refused"] = True
        result["over_limit_error"] = exc.name
    # ... and step by step the client gets about its limit, not more.
    held = []
    while True:
        pointer = ctypes.c_uint64()
        try:
            cuda.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(STEP))
        except CudaError as exc:
            result["stopped_by"] = exc.name
            break
        held.append(pointer)
        if len(held) * STEP > 4 * over_mib * 1024 * 1024:
            result["stopped_by"] = "safety stop at 4x the limit"
            break
    result["allocated_mib"] = len(held) * STEP // (1024 * 1024)
    time.sleep(hold_s)  # let the other client overlap, and the checker list both clients
    for pointer in held:
        cuda.call("cuMemFree_v2", pointer)
    cuda.call("cuCtxDestroy_v2", context)
    return result


def used_sms(cuda: Cuda, total_sms: int) -> int:
    module = ctypes.c_void_p()
    cuda.call("cuModuleLoadData", ctypes.byref(module), ctypes.c_char_p(PTX))
    function = ctypes.c_void_p()
    cuda.call("cuModuleGetFunction", ctypes.byref(function), module, b"record_smid")
    blocks = total_sms * BLOCKS_PER_SM
    out = ctypes.c_uint64()
    cuda.call("cuMemAlloc_v2", ctypes.byref(out), ctypes.c_size_t(blocks * 4))
    cuda.call("cuMemsetD32_v2", out, ctypes.c_uint(0xFFFFFFFF), ctypes.c_size_t(blocks))
    out_arg = ctypes.c_uint64(out.value)
    cycles = ctypes.c_uint64(2_000_000)  # about a millisecond per block
    params = (ctypes.c_void_p * 2)(
        ctypes.cast(ctypes.byref(out_arg), ctypes.c_void_p),
        ctypes.cast(ctypes.byref(cycles), ctypes.c_void_p),
    )
    cuda.call("cuLaunchKernel", function, blocks, 1, 1, 32, 1, 1, 0, None, params, None)
    cuda.call("cuCtxSynchronize")
    host = (ctypes.c_uint32 * blocks)()
    cuda.call("cuMemcpyDtoH_v2", host, out, ctypes.c_size_t(blocks * 4))
    cuda.call("cuMemFree_v2", out)
    cuda.call("cuModuleUnload", module)
    return len({value for value in host if value != 0xFFFFFFFF})


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--over-mib", type=int, required=True)
    parser.add_argument("--hold-s", type=float, default=3.0)
    args = parser.parse_args()
    try:
        result = measure(args.over_mib, args.hold_s)
    except (OSError, CudaError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
