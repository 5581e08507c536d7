"""Block sizes for the flash programs: explicit, or the FlashAttention paper's rule.

Paper (Dao et al. 2022, Algorithm 1, line 1): with M the SRAM size in elements,
B_c = ceil(M / 4d), B_r = min(ceil(M / 4d), d). We clamp each to its sequence length, since a
block longer than the sequence only reserves SRAM it never fills. The rule counts four B x d
tiles; a program that keeps more on chip (the backward passes) passes `fits`, and B_c, then B_r,
is halved until the program's real SRAM need fits.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

AUTO = "auto"


@dataclass(frozen=True)
class FlashBlocks:
    """A flash program's mapping: query rows and key/value rows per block (or "auto")."""
    block_q: int | str = AUTO
    block_kv: int | str = AUTO


def auto_blocks(sram_bytes_per_sm: int, itemsize: int, head_dim: int, seq_len_q: int, seq_len_kv: int,
                fits=None) -> tuple[int, int]:
    m_elems = sram_bytes_per_sm // itemsize
    bc = math.ceil(m_elems / (4 * head_dim))
    br = min(bc, head_dim)
    br, bc = max(1, min(br, seq_len_q)), max(1, min(bc, seq_len_kv))
    return (br, bc) if fits is None else halve_until(br, bc, fits)


def halve_until(br: int, bc: int, fits, floor: int = 1) -> tuple[int, int]:
    """Halve the larger block (B_c on a tie) until `fits(br, bc)`, none halved below `floor`
    (the SRAM-fit rule of every flash program's "auto" blocks)."""
    while not fits(br, bc) and (br > floor or bc > floor):
        if bc > floor and bc >= br:
            bc //= 2
        else:
            br //= 2
    return br, bc



def resolve_flash_blocks(sram_bytes_per_sm: int, wl, blocks: FlashBlocks, need) -> tuple[FlashBlocks, tuple]:
    """(blocks, notes): "auto" by the paper's rule, shrunk until `need(br, bc)` (the program's
    SRAM need over every pass it runs) fits; a given block longer than its sequence clamped to it
    (it would only reserve SRAM for rows that do not exist), and said so."""
    br, bc = auto_blocks(sram_bytes_per_sm, wl.itemsize, wl.head_dim, wl.seq_len_q, wl.seq_len_kv,
                         lambda r, c: need(r, c) <= sram_bytes_per_sm)
    out, notes = {}, []
    for key, auto, seq_field in (("block_q", br, "seq_len_q"), ("block_kv", bc, "seq_len_kv")):
        value, seq = getattr(blocks, key), getattr(wl, seq_field)
        if value == AUTO:
            value = auto
        elif value > seq:
            notes.append(f"{key} = {value} is longer than {seq_field} = {seq}: clamped to {seq}")
            value = seq
        out[key] = value
    return replace(blocks, **out), tuple(notes)


def flash_steps(wl, blocks: FlashBlocks, training: bool) -> int:
    """Tile steps (one K/V block against one query block): the backward does about twice the
    forward's."""
    steps = wl.groups * math.ceil(wl.seq_len_q / blocks.block_q) * math.ceil(wl.seq_len_kv / blocks.block_kv)
    return steps * (3 if training else 1)

