"""What one compiled flash-attention kernel is: storage dtype, block sizes, head dim.

The kernel (flash_attention.cu) takes these as template parameters; everything that checks a
configuration or needs its shared-memory size goes through `KernelConfig`, so the GPU launcher,
the CPU emulation and the nvcc compile check agree. Errors a user can cause raise HbmsimError
naming the field, the value and the limit.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hbmsim.simulator import HbmsimError

KERNEL_DIR = Path(__file__).parent
FLASH_SOURCE = KERNEL_DIR / "flash_attention.cu"
SOFTMAX_SOURCE = KERNEL_DIR / "softmax.cu"

# storage dtype -> (C++ type in the kernel, numpy dtype, dtype code of emulation_entry.h)
DTYPES = {"fp32": ("float", np.dtype(np.float32), 1), "fp16": ("fp16", np.dtype(np.float16), 2)}
# Powers of two, so SwizzledTile's XOR stays inside a row; 256 compiles too, but its fp32
# accumulator row does not fit in 255 registers and spills (ptxas), so it is not offered.
HEAD_DIMS = (32, 64, 128)
MAX_THREADS_PER_BLOCK = 1024          # one thread per query row (CUDA's limit per block)
MAX_GRID_Y = 65535                    # grid.y = batch * heads


def dtype_name(array_dtype) -> str:
    """Storage dtype name ("fp16", "fp32") of a numpy or CuPy array dtype."""
    dt = np.dtype(array_dtype)
    for name, (_, np_dtype, _) in DTYPES.items():
        if dt == np_dtype:
            return name
    raise HbmsimError(f"kernel: field 'dtype' = {dt.name!r} must be one of float16 (fp16), float32 (fp32)")


@dataclass(frozen=True)
class KernelConfig:
    dtype: str
    block_q: int
    block_kv: int
    head_dim: int

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise HbmsimError(f"kernel: field 'dtype' = {self.dtype!r} must be one of {', '.join(DTYPES)}")
        for name, limit in (("block_q", MAX_THREADS_PER_BLOCK), ("block_kv", None)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (limit and v > limit):
                bound = f"in 1..{limit}" if limit else ">= 1"
                raise HbmsimError(f"kernel: field '{name}' = {v!r} must be a whole number {bound}")
        if self.head_dim not in HEAD_DIMS:
            raise HbmsimError(f"kernel: field 'head_dim' = {self.head_dim!r} must be one of "
                              f"{', '.join(map(str, HEAD_DIMS))}")

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype][1].itemsize

    @property
    def dtype_code(self) -> int:
        return DTYPES[self.dtype][2]

    @property
    def smem_bytes(self) -> int:
        """Dynamic shared memory per block: Q_i, K_j, V_j tiles in the storage dtype
        (FlashSmem in flash_attention.cu; the kernel has no static shared memory)."""
        return (self.block_q + 2 * self.block_kv) * self.head_dim * self.itemsize

    @property
    def template_args(self) -> str:
        return f"{DTYPES[self.dtype][0]}, {self.block_q}, {self.block_kv}, {self.head_dim}"

    @property
    def kernel_name(self) -> str:
        """The C++ name of this instantiation (CuPy name expression, ptxas entry)."""
        return f"flash_attention_forward<{self.template_args}>"

    def label(self) -> str:
        return f"{self.dtype} {self.block_q}x{self.block_kv} d={self.head_dim}"


def check_shapes(q_shape, k_shape, v_shape) -> tuple[int, int, int, int, int]:
    """(batch, heads, seq_len_q, seq_len_kv, head_dim) from (batch, heads, seq, head_dim) shapes."""
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        if len(shape) != 4 or min(shape) < 1:
            raise HbmsimError(f"input {name}: shape {tuple(shape)} must be (batch, heads, seq, head_dim), each >= 1")
    b, h, nq, d = q_shape
    if tuple(k_shape) != tuple(v_shape) or k_shape[0] != b or k_shape[1] != h or k_shape[3] != d:
        raise HbmsimError(f"input k, v: shapes {tuple(k_shape)}, {tuple(v_shape)} must equal "
                          f"({b}, {h}, seq_len_kv, {d}) to match q {tuple(q_shape)}")
    if b * h > MAX_GRID_Y:
        raise HbmsimError(f"input q: batch * heads = {b * h} must be <= {MAX_GRID_Y} (grid.y limit)")
    return b, h, nq, k_shape[2], d


def default_scale(head_dim: int, scale: float | None) -> float:
    if scale is None:
        return 1.0 / float(np.sqrt(head_dim))
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not np.isfinite(scale) or scale <= 0:
        raise HbmsimError(f"kernel: field 'scale' = {scale!r} must be a finite number > 0")
    return float(scale)
