"""A CUDA process for tests/gpu/enforcement_check.sh: does its memory cap hold?

Only the CUDA driver (libcuda.so.1, present wherever the NVIDIA driver is) is needed, through
ctypes, as in mps_client.py. It creates a context on device 0 and prints one JSON object:

* ``total_mib`` / ``free_mib``: what cuMemGetInfo reports inside the cap (a driver limit
  reports the limit as the total, NVIDIA's MPS v3 memory partitioning page, "How Limits Are
  Reported"; for MPS's pinned limit this is what the check records);
* ``over_refused`` / ``over_error``: whether one allocation of ``--over-mib`` MiB was refused,
  and with which CUDA error;
* ``under_ok`` / ``under_error``: whether one allocation of ``--under-mib`` MiB succeeded.

With ``--ready-file`` it creates that file once the under-cap allocation is held, then holds
it ``--hold-s`` seconds (the check lists the GPU's processes through NVML meanwhile).

Usage: python memory_client.py --over-mib N --under-mib M [--ready-file F --hold-s S].
"""

from __future__ import annotations

import argparse
import ctypes
import json
import sys
import time
from pathlib import Path

CUDA_SUCCESS = 0
MIB = 1024 * 1024


class CudaError(Exception):
    def __init__(self, call: str, name: str) -> None:
        super().__init__(f"{call} failed: {name}")
        self.name = name


class Cuda:
    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def call(self, name: str, *args: object) -> None:
        code = getattr(self.lib, name)(*args)
        if code != CUDA_SUCCESS:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorName(code, ctypes.byref(text))
            raise CudaError(name, (text.value or b"?").decode())

    def alloc(self, mib: int) -> ctypes.c_uint64:
        pointer = ctypes.c_uint64()
        self.call("cuMemAlloc_v2", ctypes.byref(pointer), ctypes.c_size_t(mib * MIB))
        return pointer


def measure(args: argparse.Namespace) -> dict[str, object]:
    cuda = Cuda()
    cuda.call("cuInit", 0)
    device = ctypes.c_int()
    cuda.call("cuDeviceGet", ctypes.byref(device), 0)
    context = ctypes.c_void_p()
    cuda.call("cuCtxCreate_v2", ctypes.byref(context), 0, device)
    free, total = ctypes.c_size_t(), ctypes.c_size_t()
    cuda.call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
    result: dict[str, object] = {"total_mib": total.value // MIB, "free_mib": free.value // MIB}
    try:
        cuda.call("cuMemFree_v2", cuda.alloc(args.over_mib))
        result.update(over_refused=False, over_error=None)
    except CudaError as exc:
        result.update(over_refused=True, over_error=exc.name)
    try:
        held = cuda.alloc(args.under_mib)
        result.update(under_ok=True, under_error=None)
    except CudaError as exc:
        held = None
        result.update(under_ok=False, under_error=exc.name)
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
        time.sleep(args.hold_s)
    if held is not None:
        cuda.call("cuMemFree_v2", held)
    cuda.call("cuCtxDestroy_v2", context)
    return result


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--over-mib", type=int, required=True)
    parser.add_argument("--under-mib", type=int, required=True)
    parser.add_argument("--ready-file")
    parser.add_argument("--hold-s", type=float, default=0.0)
    args = parser.parse_args()
    try:
        result = measure(args)
    except (OSError, CudaError) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
