"""Kernel to kernel: which measured kernel rows (torch.profiler's CUDA activity, one row per kernel
name with its device time per pass) each predicted kernel stands for.

A program variant models what a library runs, kernel by kernel; the library's kernels carry
their own names (CUTLASS templates, cuBLAS's nvjet GEMMs, ATen's elementwise and softmax
kernels). Each variant describes its kernels here as groups: a label, a pattern that the
measured names of the group match, and the hbmsim kernels that model them. A group compares
the summed predicted device time of its hbmsim kernels with the summed measured time of its
rows, so one off kernel shows as one off group. Measured rows that no group claims (a Memset,
say) and predicted time that no group claims (the L2 write-back at a pass's end) are reported
as such, never dropped: the pass's kernel sum keeps them.
"""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class KernelGroup:
    label: str
    measured: str               # regular expression over the measured kernel names
    predicted: tuple            # the hbmsim kernels (Launch names) that model them


# flash2 fa2-kernel: the FlashAttention-2 kernels vendored in PyTorch (flash_fwd_kernel.h,
# flash_bwd_kernel.h, flash_bwd_preprocess_kernel.h), one launch each per pass.
_FA2 = (
    KernelGroup("forward", r"flash_fwd_kernel|flash_fwd_splitkv_kernel", ("flash2_fwd", "flash2_fwd_splitkv")),
    KernelGroup("split-KV combine", r"flash_fwd_splitkv_combine_kernel", ("flash2_fwd_splitkv_combine",)),
    KernelGroup("dO.O (preprocess)", r"flash_bwd_dot_do_o", ("flash2_bwd_dot_do_o",)),
    KernelGroup("dQ dK dV", r"flash_bwd_dq_dk_dv", ("flash2_bwd",)),
    KernelGroup("convert dQ", r"flash_bwd_convert_dq", ("flash2_bwd_convert_dq",)),
)
# standard pytorch-bench: attention_pytorch of flash-attention's benchmark_flash_attention.py,
# op by op: cuBLAS GEMMs (nvjet on Hopper, ampere_/sm80_ cutlass on A100), ATen's copies for the
# rearranges and the einsum's layout, ATen's softmax, and elementwise multiplies in the backward.
_PYTORCH = (
    KernelGroup("GEMMs", r"nvjet|gemm|cutlass|xmma|ampere_|sm80_|sm90_",
                ("baddbmm", "bmm_pv", "bmm_bwd_dp", "bmm_bwd_dv", "baddbmm_bwd_dq", "baddbmm_bwd_dk")),
    KernelGroup("softmax", r"softmax_warp_forward|cunn_SoftMaxForward", ("softmax",)),
    KernelGroup("softmax backward", r"softmax_warp_backward|cunn_SoftMaxBackward", ("softmax_bwd",)),
    KernelGroup("copies (rearrange, einsum, stack, mask cast)", r"direct_copy|CatArrayBatchedCopy|copy_kernel",
                ("rearrange_q", "rearrange_k", "einsum_copy_v", "stack_qkv_grad", "causal_to_dtype")),
    KernelGroup("causal mask (full, triu, add)", r"FillFunctor|triu_tril|CUDAFunctor_add",
                ("causal_full", "causal_triu", "causal_add")),
    KernelGroup("elementwise multiplies", r"MulFunctor", ("softmax_bwd_mul", "mul_alpha_dq", "mul_alpha_dk")),
)
# flash3 fa3-kernel: FlashAttention-3's kernels (hopper/: flash_fwd_kernel_sm90.h FlashAttnFwdSm90,
# flash_bwd_preprocess_kernel.h FlashAttnBwdPreprocess, flash_bwd_kernel_sm90.h FlashAttnBwdSm90,
# flash_bwd_postprocess_kernel.h FlashAttnBwdPostprocessConvertdQ), and the fused kernels of torch's cuDNN
# attention that the same program stands for, whose generated names carry "sdpa" and "fprop" or "bprop",
# with cuDNN's own backward pre- and post-processing kernels (cudnn::fusion::compute_dot_do_o_specialized,
# cudnn::fusion::convert_dq_to_16bits: their names in scenarios/measured/h200-torch-hopper.json), which do
# what FA3's preprocess and convert-dQ kernels do.
_FA3 = (
    KernelGroup("forward", r"FlashAttnFwdSm90|sdpa\w*fprop|fprop\w*sdpa", ("flash3_fwd",)),
    KernelGroup("dO.O (preprocess)", r"FlashAttnBwdPreprocess|compute_dot_do_o", ("flash3_bwd_preprocess",)),
    KernelGroup("dQ dK dV", r"FlashAttnBwdSm90|sdpa\w*bprop|bprop\w*sdpa", ("flash3_bwd",)),
    KernelGroup("convert dQ", r"FlashAttnBwdPostprocess|convert_dq_to_16bits", ("flash3_bwd_convert_dq",)),
)
GROUPS = {("flash2", "fa2-kernel"): _FA2, ("standard", "pytorch-bench"): _PYTORCH, ("flash3", "fa3-kernel"): _FA3,
          ("flash3", "cudnn-sm90"): _FA3}

UNCLAIMED_MEASURED = "measured, not modelled"       # rows no group claims (e.g. Memset)
UNCLAIMED_PREDICTED = "predicted, not a kernel row"  # e.g. the L2 write-back at the end of a pass
# a group whose rows count fewer launches than its predicted kernels: some of its kernels are
# missing from the measurement (h100-torch-fwd-bwd.json at N = 16384: the rearranges' copies have
# no row), so its times are not compared; more measured launches are fine (ATen splits an
# elementwise kernel over more than 2^31 elements into several launches, where hbmsim runs one)
ROWS_MISSING = "predicted, its kernel rows missing"


def compare_kernels(algorithm: str, variant: str, predicted: list, measured: list) -> list | None:
    """[(group label, predicted device s, measured device s)] for one pass: `predicted` the
    result's kernels ({"name", "time_s"}), `measured` the run's kernel rows ({"name", "time_s"}
    per pass). None when the variant describes no groups or the run has no kernel rows."""
    groups = GROUPS.get((algorithm, variant))
    if not groups or not measured:
        return None
    pred = {g.label: 0.0 for g in groups}
    meas = {g.label: 0.0 for g in groups}
    pred_launches = {g.label: 0 for g in groups}
    meas_launches = {g.label: 0.0 for g in groups}      # None once a row does not say
    extra_pred = extra_meas = missing = 0.0
    owner = {name: g.label for g in groups for name in g.predicted}
    for k in predicted:
        if k["name"] in owner:
            pred[owner[k["name"]]] += k["time_s"]
            pred_launches[owner[k["name"]]] += 1
        else:
            extra_pred += k["time_s"]
    for row in measured:
        g = next((g for g in groups if re.search(g.measured, row["name"])), None)
        if g is None:
            extra_meas += row["time_s"]
        else:
            meas[g.label] += row["time_s"]
            n = meas_launches[g.label]
            meas_launches[g.label] = None if n is None or row.get("launches") is None else n + row["launches"]
    out = []
    for g in groups:
        p, m, n = pred[g.label], meas[g.label], meas_launches[g.label]
        if m and n is not None and n < pred_launches[g.label]:
            missing += p                     # some of its kernels have no row: not comparable
            extra_meas += m
        elif p or m:
            out.append((g.label, p, m))
    if extra_meas:
        out.append((UNCLAIMED_MEASURED, 0.0, extra_meas))
    if extra_pred:
        out.append((UNCLAIMED_PREDICTED, extra_pred, 0.0))
    if missing:
        out.append((ROWS_MISSING, missing, 0.0))
    return out
