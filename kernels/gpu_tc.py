"""The tensor-core kernel (flash_attention_tc.cu) on a GPU through CuPy, and its compile check.

`flash_attention_tc(q, k, v, dtype=...)` takes CuPy arrays (batch, heads, seq, head_dim): float16
for fp16, uint16 bit patterns for bf16 (CuPy has no bfloat16 dtype), and returns (O like q, lse
float32 (batch, heads, seq_q)). Each configuration (TcConfig: dtype, blocks, head dim, warps) is
its own NVRTC compilation through cupy.RawModule (-D options), cached per device in this process
and by CuPy on disk. Above 48 KiB of shared memory the kernel opts in
(cudaFuncAttributeMaxDynamicSharedMemorySize); beyond the device's opt-in limit: HbmsimError
before launch.

`compile_report(cfg, arch)` needs only the CUDA toolkit (nvcc, ptxas), no GPU: ptxas's registers,
spills and static shared memory for one configuration.
"""
from __future__ import annotations

import math
import re
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hbmsim.simulator import HbmsimError

from .compile_check import find_nvcc, find_ptxas
from .config import KERNEL_DIR
from .emulation_tc_config import TcConfig, lse_rows_padded

TC_SOURCE = KERNEL_DIR / "flash_attention_tc.cu"
KERNEL_NAME = "flash_attention_tc"
NVRTC_OPTIONS = ("-std=c++17",)
DEFAULT_SMEM_LIMIT_BYTES = 48 * 1024      # above this a kernel must opt in (CUDA C++ Programming Guide)
ATTR_MAX_SMEM_PER_BLOCK_OPTIN = 97        # cudaDevAttrMaxSharedMemoryPerBlockOptin
LOG2E = math.log2(math.e)
_kernels: dict = {}


def _cupy():
    from .gpu import cupy_module
    return cupy_module()


def kernel(cfg: TcConfig):
    """The compiled kernel for cfg on the current device (compiled once per process)."""
    cp = _cupy()
    key = (cfg, cp.cuda.Device().id)
    if key not in _kernels:
        module = cp.RawModule(code=TC_SOURCE.read_text(), options=NVRTC_OPTIONS + cfg.defines)
        fn = module.get_function(KERNEL_NAME)
        limit = cp.cuda.runtime.deviceGetAttribute(ATTR_MAX_SMEM_PER_BLOCK_OPTIN, cp.cuda.Device().id)
        if cfg.smem_bytes > limit:
            raise HbmsimError(f"tensor-core kernel {cfg.label()}: a block needs {cfg.smem_bytes} bytes of shared "
                              f"memory, more than this GPU's limit {limit} (max opt-in shared memory per block)")
        if cfg.smem_bytes > DEFAULT_SMEM_LIMIT_BYTES:
            fn.max_dynamic_shared_size_bytes = cfg.smem_bytes
        _kernels[key] = fn
    return _kernels[key]


def flash_attention_tc(q, k, v, *, dtype: str = "fp16", block_q: int | None = None, block_kv: int | None = None,
                       warps: int | None = None, causal: bool = False, scale: float | None = None):
    """Forward attention on the GPU with the tensor-core kernel; blocks and warps default to the
    launch rule (TC_TRAITS). Returns (O, lse)."""
    cp = _cupy()
    want = {"fp16": np.float16, "bf16": np.uint16}.get(dtype)
    if want is None:
        raise HbmsimError(f"tensor-core kernel: field 'dtype' = {dtype!r} must be one of fp16, bf16")
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.dtype != want or x.ndim != 4:
            raise HbmsimError(f"input {name}: {x.dtype} {tuple(x.shape)} must be {np.dtype(want).name} "
                              "(batch, heads, seq, head_dim)" + (" (bf16 as uint16 bits)" if dtype == "bf16" else ""))
    b, h, nq, d = q.shape
    nk = k.shape[2]
    if k.shape != v.shape or k.shape[:2] != (b, h) or k.shape[3] != d:
        raise HbmsimError(f"inputs: q {q.shape}, k {k.shape}, v {v.shape} must share batch, heads and head_dim")
    cfg = TcConfig.default(dtype, d, block_q, block_kv, warps)
    fn = kernel(cfg)
    q, k, v = (cp.ascontiguousarray(x) for x in (q, k, v))
    o = cp.empty_like(q)
    lse = cp.empty((b, h, lse_rows_padded(nq)), dtype=cp.float32)    # Nq8 rows: whole-sector stores
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    fn((math.ceil(nq / cfg.block_q), b * h), (cfg.threads,),
       (q, k, v, o, lse, np.int32(nq), np.int32(nk), np.float32(scale), np.float32(scale * LOG2E),
        np.int32(bool(causal))), shared_mem=cfg.smem_bytes)
    return o, lse[:, :, :nq]


# ---- compile check (CUDA toolkit, no GPU) -------------------------------------------------------

_USED = re.compile(r"Used (\d+) registers")
_SPILL = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_SMEM = re.compile(r"(\d+) bytes smem")


@dataclass(frozen=True)
class TcResources:
    config: TcConfig
    arch: str
    registers: int               # per thread (ptxas -v)
    spill_store_bytes: int
    spill_load_bytes: int
    static_smem_bytes: int       # 0: the kernel's shared memory is all dynamic (TcConfig.smem_bytes)


def compile_report(cfg: TcConfig, arch: str = "sm_80") -> TcResources:
    """nvcc -ptx then ptxas -v for one configuration; HbmsimError without the toolkit."""
    nvcc = find_nvcc()
    ptxas = find_ptxas(nvcc) if nvcc else None
    if nvcc is None or ptxas is None:
        raise HbmsimError("compile check: nvcc or ptxas not found (set NVCC or put the CUDA toolkit on the PATH)")
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "tc.ptx"
        for cmd in ([nvcc, "-ptx", "-std=c++17", f"-arch={arch}", *cfg.defines, str(TC_SOURCE), "-o", str(ptx)],
                    [ptxas, f"-arch={arch}", "-v", str(ptx), "-o", str(Path(tmp) / "tc.cubin")]):
            proc = subprocess.run(cmd, capture_output=True, text=True)
            if proc.returncode != 0:
                raise HbmsimError(f"compile check: {Path(cmd[0]).name} failed (exit {proc.returncode}): "
                                  + " | ".join(proc.stderr.strip().splitlines()[:8]))
        text = proc.stdout + proc.stderr
    used, spill, smem = _USED.search(text), _SPILL.search(text), _SMEM.search(text)
    if used is None:
        raise HbmsimError(f"compile check: no register count in ptxas's report for {cfg.label()}")
    return TcResources(cfg, arch, int(used.group(1)), int(spill.group(2)) if spill else 0,
                       int(spill.group(3)) if spill else 0, int(smem.group(1)) if smem else 0)
