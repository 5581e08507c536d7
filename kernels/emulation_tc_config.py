"""The tensor-core kernel's configurations (kernels/flash_attention_tc.cu): its launch rule (a
table of tile parameters per head dim, as FlashAttention's kernel_traits.h), what one
instantiation is, and the checks a configuration must pass before the emulation or the GPU runs
it (one line each, HbmsimError). Shared by kernels/emulation_tc.py and kernels/gpu_tc.py.

The same table is algorithms/flash2_rawkernel_tc.py's TC_TRAITS (kernels/ does not import
algorithms/); tests/test_rawkernel_tc.py checks that they agree.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from hbmsim.simulator import HbmsimError

TC_DTYPES = {"fp16": 2, "bf16": 2}       # storage dtype -> bytes per element
TC_HEAD_DIMS = (64, 128)
MMA_M, MMA_K = 16, 16                    # mma.sync.aligned.m16n8k16 (PTX ISA, "Matrix shape")
CHUNK_BYTES = 16                         # one cp.async.cg / st.global.v4 per thread: 16 bytes
SECTOR_BYTES = 32                        # L2 / DRAM access unit (CUDA C++ Best Practices Guide)
LSE_ROW_ALIGN = 8                        # lse rows padded to 8 per batch-head: 8 x 4 B = one sector
MAX_WARPS = 16                           # 512 threads: __launch_bounds__ in the source
# H100's opt-in shared memory per block (227 KiB, CUDA C++ Programming Guide, "Compute Capability
# 9.0", cudaDevAttrMaxSharedMemoryPerBlockOptin); the emulation refuses more, as that GPU would.
MAX_SMEM_BYTES = 232_448


@dataclass(frozen=True)
class TcTraits:
    block_q: int
    block_kv: int
    warps: int
    stages: int


# Per head dim (the source's TcTraits<HEAD_DIM> holds the same numbers): 8 warps of 16 query rows,
# two K/V stages. 64: 128 x 128 tiles, 80 KiB of shared memory; 128: 128 x 64, 96 KiB.
TC_TRAITS = {64: TcTraits(128, 128, 8, 2), 128: TcTraits(128, 64, 8, 2)}


def lse_rows_padded(seq_len_q: int) -> int:
    return math.ceil(seq_len_q / LSE_ROW_ALIGN) * LSE_ROW_ALIGN


@dataclass(frozen=True)
class TcConfig:
    """One instantiation: flash_attention_tc<DTYPE, BLOCK_Q, BLOCK_KV, HEAD_DIM, WARPS, STAGES>."""
    dtype: str
    block_q: int
    block_kv: int
    head_dim: int
    warps: int
    stages: int = 2

    def __post_init__(self):
        def bad(field, value, limit):
            raise HbmsimError(f"tensor-core kernel: field '{field}' = {value!r} must be {limit}")
        if self.dtype not in TC_DTYPES:
            bad("dtype", self.dtype, "one of " + ", ".join(TC_DTYPES))
        if self.head_dim not in TC_HEAD_DIMS:
            bad("head_dim", self.head_dim, "one of 64, 128")
        for f in ("block_q", "block_kv", "warps", "stages"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                bad(f, v, "a whole number >= 1")
        if not 1 <= self.warps <= MAX_WARPS:
            bad("warps", self.warps, f"in 1..{MAX_WARPS}")
        if self.block_q % (MMA_M * self.warps):
            bad("block_q", self.block_q, f"a multiple of 16 x warps = {MMA_M * self.warps}")
        if self.block_kv % MMA_K:
            bad("block_kv", self.block_kv, "a multiple of 16")
        if self.stages != 2:
            bad("stages", self.stages, "2 (the source double-buffers K/V)")
        if self.smem_bytes > MAX_SMEM_BYTES:
            raise HbmsimError(f"tensor-core kernel {self.label()}: a block needs {self.smem_bytes} bytes of shared "
                              f"memory, more than {MAX_SMEM_BYTES} (H100's opt-in maximum)")

    @classmethod
    def default(cls, dtype: str, head_dim: int, block_q: int | None = None, block_kv: int | None = None,
                warps: int | None = None) -> "TcConfig":
        """The launch rule: TC_TRAITS' row for the head dim, any field given replacing its value
        (warps, when not given: the row's, at most block_q / 16)."""
        if head_dim not in TC_TRAITS:
            raise HbmsimError(f"tensor-core kernel: field 'head_dim' = {head_dim!r} must be one of 64, 128")
        row = TC_TRAITS[head_dim]
        bq = block_q or row.block_q
        return cls(dtype, bq, block_kv or row.block_kv, head_dim, warps or min(row.warps, max(1, bq // MMA_M)),
                   row.stages)

    @property
    def itemsize(self) -> int:
        return TC_DTYPES[self.dtype]

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def smem_bytes(self) -> int:
        # Q_i (reused to stage O_i) and `stages` buffers of K_j and V_j, in the storage dtype
        return (self.block_q + 2 * self.stages * self.block_kv) * self.head_dim * TC_DTYPES.get(self.dtype, 2)

    def label(self) -> str:
        return f"{self.dtype} {self.block_q}x{self.block_kv} d={self.head_dim} warps={self.warps}"

    @property
    def defines(self) -> tuple:
        """NVRTC -D options selecting this instantiation in flash_attention_tc.cu."""
        return (f"-DTC_BF16={int(self.dtype == 'bf16')}", f"-DTC_BLOCK_Q={self.block_q}",
                f"-DTC_BLOCK_KV={self.block_kv}", f"-DTC_HEAD_DIM={self.head_dim}", f"-DTC_WARPS={self.warps}",
                f"-DTC_STAGES={self.stages}")
