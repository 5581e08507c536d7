"""Block sizes for the flash programs: explicit, or the FlashAttention paper's rule.

Paper (Dao et al. 2022, Algorithm 1, line 1): with M the SRAM size in elements,
B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d). We clamp each to its sequence length, since a
block longer than the sequence only reserves SRAM it never fills. The rule counts four B x d
tiles; a program that keeps more on chip (the backward passes) passes `fits`, and B_c, then B_r,
is halved until the program's real SRAM need fits.
"""
from __future__ import annotations

import math

def auto_blocks(sram_bytes_per_sm: int, itemsize: int, head_dim: int, seq_len_q: int, seq_len_kv: int,
                fits=None) -> tuple[int, int]:
    m_elems = sram_bytes_per_sm // itemsize
    bc = math.ceil(m_elems / (4 * head_dim))
    br = min(bc, head_dim)
    br, bc = max(1, min(br, seq_len_q)), max(1, min(bc, seq_len_kv))
    while fits is not None and not fits(br, bc) and (br > 1 or bc > 1):
        if bc > 1 and bc >= br:
            bc //= 2
        else:
            br //= 2
    return br, bc

