"""The attention implementations that measured files name, and the hbmsim program and variant
that reproduces each: the one table that both the published files (scenarios/published.py) and
the library timings (kernels/library_timing.py) use.

A measured file's run names its implementation ("implementation": "fa2") and carries the
program and variant from here ("algorithm": "flash2", "variant": "fa2-kernel"); `hbmsim
validate` simulates that program and variant against it. The README's Mappings table gives the
sources of each variant. This module lives in kernels/ (the lowest layer that both may import):
it names programs and variants as plain strings and imports nothing from hbmsim.algorithms.
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Implementation:
    """One implementation as measured files name it."""
    name: str                       # the runs' "implementation" field
    algorithm: str                  # the hbmsim program that reproduces it
    variant: str                    # ... and that program's variant
    in_fa2_paper: str | None = None # what the FlashAttention-2 paper timed under this name (None: not in it)
    timed_here: str | None = None   # what `hbmsim profile-library` times under this name ({torch}: its
                                    # version); None: not timed by this project
    grid: str = "paper"             # the grid it is timed over: "paper" (the FA2 paper's, forward and
                                    # backward) or "decode" (one query row against a long KV cache,
                                    # kernels/library_decode.py)
    # ((pass, ops), ...): the framework ops the timed_here harness (kernels/library_timing.make_fn)
    # dispatches around the library call before the pass's first kernel, beyond the program's own
    # (Launch.host_ops): the stopwatch sees them (simulator/host.py). Python-level calls that are
    # not framework ops (sdpa_kernel's backend flags, setting .grad to None) are not counted.
    caller_ops: tuple = ()
    # whether the timed_here harness calls torch.nn.functional.scaled_dot_product_attention on inputs
    # that autograd records (requires_grad, as the training grids'): each pass then pays SDPA's own host
    # work (simulator/host.py: sdpa_forward_s, sdpa_backward_s, measured on such calls)
    sdpa: bool = False

    def describe(self, what: str) -> str:
        """The provenance's line for this implementation: its program, variant and `what` ran."""
        return f"hbmsim algorithm {self.algorithm}, variant {self.variant}: {what}"


IMPLEMENTATIONS: dict[str, Implementation] = {i.name: i for i in (
    Implementation(
        "fa2", "flash2", "fa2-kernel",
        in_fa2_paper="FlashAttention-2 v2.0.x, the paper's release (July 2023)",
        timed_here="torch.nn.functional.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION (the "
                   "FlashAttention-2 kernels vendored in torch {torch}; not the v2.0.x release of the paper)",
        # forward: q, k and v each .transpose(1, 2) (a view, recorded by autograd) before SDPA, whose own op
        # is the program's; backward: the engine and SDPA's node are the program's, the transposes' nodes
        # run after its kernels
        caller_ops=(("forward", 3),), sdpa=True),
    Implementation(
        "fa1", "flash1", "fa1-kernel",
        in_fa2_paper="FlashAttention v1.0.9, the newest v1 at the time (Dao-AILab/flash-attention#505), which "
                     "splits the query sequence across thread blocks"),
    Implementation(
        "pytorch", "standard", "pytorch-bench",
        in_fa2_paper="attention_pytorch of benchmarks/benchmark_flash_attention.py",
        timed_here="attention_pytorch of the flash-attention repository's benchmarks/benchmark_flash_attention.py, "
                   "reproduced op for op"),
    # Hopper's warp-specialised kernels (issue 26), simulated by the flash3 program (a GPU without TMA and
    # wgmma is refused: kernels/library_timing.make_fn skips them there, the reason in the file).
    Implementation(
        "cudnn", "flash3", "cudnn-sm90",
        timed_here="torch.nn.functional.scaled_dot_product_attention with SDPBackend.CUDNN_ATTENTION (cuDNN's "
                   "fused flash attention, cuDNN {cudnn} in torch {torch}; on sm90 a warp-specialised kernel with "
                   "TMA loads and wgmma GEMMs, as FlashAttention-3's: not FA3 itself, its tiles and schedule are "
                   "cuDNN's own)",
        caller_ops=(("forward", 3),), sdpa=True),    # the same harness as fa2's: three transposes before SDPA
    Implementation(
        "fa3", "flash3", "fa3-kernel",
        timed_here="flash_attn_interface.flash_attn_func of FlashAttention-3 (the hopper/ directory of "
                   "Dao-AILab/flash-attention, built on the machine; version in the provenance)"),
    # Decode (issue 25): the FA2 kernels with grouped-query heads, one query row per sequence, num_splits
    # and pack_gqa "auto" (FA2's num_splits_heuristic and seqlenq_ngroups_swapped).
    Implementation(
        "sdpa-gqa-decode", "flash2", "fa2-kernel", grid="decode",
        timed_here="torch.nn.functional.scaled_dot_product_attention with SDPBackend.FLASH_ATTENTION and "
                   "enable_gqa=True, q (B, 32, 1, 128) against k, v (B, 8, N, 128), forward only (the "
                   "FlashAttention-2 kernels vendored in torch {torch}: split-KV and packed GQA as its mha_fwd "
                   "decides)"),
        # (not `sdpa`: host.HostSpec's SDPA fields were measured on calls that autograd records, as the
        # training harness's are; a decode call records nothing, and its host cost is not measured: the
        # B = 1, N = 1k call took 48.5 us in all, 10.6 us of it kernels, less than those fields charge)
    Implementation(
        "fa2-kvcache", "flash2", "fa2-kernel", grid="decode",
        timed_here="flash_attn.flash_attn_with_kvcache of the flash-attn package (version in the provenance), "
                   "num_splits=0 (its heuristic), KV cache contiguous (B, N, 8, 128) or paged (pages of 256 "
                   "tokens in a shuffled block table), no new tokens appended, forward only"),
)}

# The implementations this project times itself over the FA2 paper's grid (kernels/library_timing.py)
# and over the decode grid (kernels/library_decode.py), in the table's order; those the paper timed.
TIMED_HERE: dict[str, Implementation] = {n: i for n, i in IMPLEMENTATIONS.items()
                                         if i.timed_here and i.grid == "paper"}
TIMED_DECODE: dict[str, Implementation] = {n: i for n, i in IMPLEMENTATIONS.items()
                                           if i.timed_here and i.grid == "decode"}
IN_FA2_PAPER: dict[str, Implementation] = {n: i for n, i in IMPLEMENTATIONS.items() if i.in_fa2_paper}
