"""The library kernels (kernels/library_timing.py) under the profilers, and Nsight Compute's
output summarised:

- ncu_one: one warmed configuration's forward or backward between cudaProfilerStart and Stop,
  the process that `ncu --profile-from-start off` profiles;
- op_table: which PyTorch operator launched each kernel (torch.profiler, CPU + CUDA);
- summarise_ncu_raw: ncu's raw page (--csv --page raw, --set full) -> per kernel the launch
  shape, occupancy limits, clock, DRAM and L2 bytes and pipe utilisation (NCU_SUMMARY_METRICS),
  as scenarios/measured/h100-ncu-kernels.json keeps them, and the warp stall reasons and global
  sector counts (NCU_SUMMARY_PREFIXES) that the files measured before them lack.
"""
from __future__ import annotations

import csv
import io
import platform
from pathlib import Path

from .library_timing import HIDDEN, TOKENS, make_fn, one_wave_grid
from .profile import ncu_table, now_utc


def _warmed(impl, d, n, causal, tiles_per_sm=None):
    """One configuration of the paper's set-up (batch = TOKENS // N, at least 1; HIDDEN // d heads),
    or with `tiles_per_sm` K one wave of K 128-row tiles an SM (batch 1, library_timing.one_wave_grid),
    after one untimed forward and backward: (inputs, fn, y, grad), y kept for more backwards."""
    import torch
    batch, heads = max(1, TOKENS // n), HIDDEN // d
    if tiles_per_sm:
        grid, skipped = one_wave_grid([n], [tiles_per_sm], torch.cuda.get_device_properties(0).multi_processor_count)
        if not grid:
            raise SystemExit(f"--tiles-per-sm {tiles_per_sm}: {skipped[0]}")
        batch, heads, _ = grid[0]
    inputs, fn = make_fn(impl, batch, n, heads, d, causal, torch.float16)
    y = fn(*inputs)
    grad = torch.randn_like(y)
    y.backward(grad, retain_graph=True)
    torch.cuda.synchronize()
    return inputs, fn, y, grad


def ncu_one(impl, d, n, causal, pass_name, tiles_per_sm=None) -> int:
    """Under ncu (--profile-from-start off): one warm-up pass, then the measured pass between
    cudaProfilerStart and Stop (process-wide: the backward's kernels launch from autograd's own thread)."""
    import torch
    inputs, fn, y, grad = _warmed(impl, d, n, causal, tiles_per_sm)
    for x in inputs:
        x.grad = None
    torch.cuda.profiler.start()
    if pass_name == "forward":
        fn(*inputs)
    else:
        y.backward(grad, retain_graph=True)
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()
    return 0


def ncu_decode(batch: int, kv_len: int) -> int:
    """Under ncu (--profile-from-start off): one decode call of the decode grid's SDPA set-up
    (kernels/library_decode.py: GQA 32/8 heads, head dim 128, one query row, KV length `kv_len`),
    after two warm-up calls and, as the timed grid does, a zeroed buffer of 4x the L2 (the cache
    cold): its split-KV and combine kernels between cudaProfilerStart and Stop."""
    import torch
    from .library_decode import SDPA, TorchDecode
    td = TorchDecode(flush_l2=True)
    with torch.no_grad():
        fn = td._call(SDPA, batch, kv_len, None)
        fn(), fn()
        td._flush()
        torch.cuda.synchronize()
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
    td.stop()
    return 0


def op_table(impl, d, n, causal) -> int:
    """Print which operator launched each kernel (torch.profiler, CPU + CUDA, input shapes)."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    inputs, fn, y, grad = _warmed(impl, d, n, causal)
    for name, call in (("forward", lambda: fn(*inputs)), ("backward", lambda: y.backward(grad, retain_graph=True))):
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], record_shapes=True) as prof:
            call()
            torch.cuda.synchronize()
        print(f"==== {impl} d={d} N={n} causal={causal} {name}")
        print(prof.key_averages(group_by_input_shape=True).table(sort_by="cuda_time_total", row_limit=40,
                                                                 max_name_column_width=90))
    return 0


# What `--summarise-ncu` keeps of Nsight Compute's raw page (--set full): launch shape, occupancy
# limits, clock, DRAM and L2 bytes, and how busy each pipe was.
NCU_SUMMARY_METRICS = (
    "gpu__time_duration.sum", "launch__grid_size", "launch__block_size", "launch__registers_per_thread",
    "launch__shared_mem_per_block_dynamic", "launch__occupancy_limit_registers", "launch__occupancy_limit_shared_mem",
    "sm__warps_active.avg.pct_of_peak_sustained_active", "sm__cycles_elapsed.avg.per_second",
    "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sectors_op_read.sum", "lts__t_sectors_op_write.sum",
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum",
    "sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active",
    "sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_lsu.avg.pct_of_peak_sustained_active",
    "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared.sum",
    "gpu__compute_memory_throughput.avg.pct_of_peak_sustained_elapsed",
    "lts__t_sector_hit_rate.pct", "lts__t_sector_op_read_hit_rate.pct", "sm__cycles_elapsed.max")


# ... and every column whose name starts with one of these (the names differ between ncu versions):
# - why warps did not issue, in cycles per issued instruction (--set full's WarpStateStats: long and
#   short scoreboard, mio_throttle (the MIO queue that shared-memory and special-function
#   instructions share: Nsight Compute's Kernel Profiling Guide, "Warp Stall Reasons"),
#   math_pipe_throttle, barrier, wait, not_selected, ...): what the pipe utilisations above cannot say,
#   how far FA2's softmax and its GEMMs overlap;
# - the global loads' and stores' L1 requests and 32-byte sectors, and the L2 sectors the SMs asked
#   for: an uncoalesced access (the transposing copies of PyTorch's baseline) asks for a sector per
#   element, which DRAM bytes do not show;
# - on sm90, the GMMA tensor pipe's activity, where a version names it apart. (Nsight Compute 2025.3
#   does not: there sm__pipe_tensor_op_hmma_cycles_active counts wgmma too. On cuDNN's sm90 forward at
#   head dim 64, h200-ncu-hopper.json, it equals sm__pipe_tensor_cycles_active, 50.53%, and the wgmma
#   FLOPs, sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off.sum = 2^39 = 4 B H N^2 d, at the 4096 a
#   clock an SM peak are 49.3% of the elapsed cycles.) Beside the XU pipe's: whether a
#   warp-specialised kernel's exps run under its GEMMs;
# - the instruction mix: instructions a pipe (ALU, FMA and its heavy and lite halves, FP16, XU, LSU,
#   uniform...) and active cycles a pipe (sm__inst_executed_pipe_*, sm__pipe_*: --set full's
#   ComputeWorkloadAnalysis), and thread instructions by kind (FFMA, FADD, FMUL, integer, conversion...:
#   smsp__sass_thread_inst_executed_op_*, the roofline's and InstructionStats' counters). The
#   backward of cuDNN's sm90 attention keeps its FMA pipe busy about twice what the program's counted
#   FP32 work takes (h200-ncu-pipes.json); whether the rest is FP32 softmax work, integer address
#   arithmetic (IMAD issues to the FMA pipe) or conversions is what these say.
NCU_SUMMARY_PREFIXES = ("smsp__average_warps_issue_stalled_", "smsp__average_warp_latency_issue_stalled_",
                        "l1tex__t_requests_pipe_lsu_mem_global_op_", "l1tex__t_sectors_pipe_lsu_mem_global_op_",
                        "lts__t_sectors_srcunit_tex_op_", "sm__pipe_",      # sm__pipe_: the GMMA pipe's too
                        "sm__inst_executed_pipe_", "smsp__sass_thread_inst_executed_op_",
                        "smsp__sass_inst_executed_op_")


def _ncu_rows(text: str) -> list:
    """ncu's raw page (--csv --page raw) as rows: the metric names, their units, then a row a kernel;
    [] when the text holds no table."""
    table = ncu_table(text)
    return [] if table is None else list(csv.reader(io.StringIO(table)))


def ncu_device(text: str) -> str | None:
    """The GPU an ncu raw page was taken on (its device__attribute_display_name), None if it does not say."""
    rows = _ncu_rows(text)
    if len(rows) < 3 or "device__attribute_display_name" not in rows[0]:
        return None
    return rows[2][rows[0].index("device__attribute_display_name")] or None


def summary_provenance(files: list, texts: list, command: list) -> dict:
    """Where a --summarise-ncu file's numbers come from: the GPU each raw page names, how they were taken."""
    return {"gpu": sorted({g for g in map(ncu_device, texts) if g}), "raw_pages": [Path(f).name for f in files],
            "collected": "ncu --csv --page raw --set full --profile-from-start off around one warmed pass "
                         "(kernels/library_nsight.py: ncu_one), ncu's default clock control: the SM clock "
                         "locked to base, so times are at sm__cycles_elapsed.avg.per_second, not boost",
            "summarised": now_utc(), "host": platform.platform(), "command": " ".join(command)}


def summarise_ncu_raw(text: str) -> list[dict]:
    """ncu --csv --page raw output -> one dict per kernel: its name and NCU_SUMMARY_METRICS (numbers as
    ncu printed them, in its units), the columns NCU_SUMMARY_PREFIXES name, plus the shared-memory
    pipe's busy fraction: wavefronts per SM (one a cycle) over the kernel's cycles."""
    rows = _ncu_rows(text)
    if not rows:
        return []
    header, units = rows[0], rows[1]
    out = []
    wanted = NCU_SUMMARY_METRICS + tuple(m for m in header if m.startswith(NCU_SUMMARY_PREFIXES))
    unit_of = dict(zip(header, units))
    for row in rows[2:]:
        d = dict(zip(header, row))
        k = {"name": d.get("Kernel Name", ""), "units": {}}
        for m in wanted:
            if m in d:
                try:
                    k[m] = float(d[m].replace(",", ""))
                except ValueError:
                    continue
                k["units"][m] = unit_of.get(m, "")
        try:
            sms = float(d["device__attribute_multiprocessor_count"].replace(",", ""))
            cycles = k["gpu__time_duration.sum"] * 1e-9 * k["sm__cycles_elapsed.avg.per_second"]
            k["shared_pipe_busy_pct"] = 100 * k["l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"] / sms / cycles
        except (KeyError, ValueError, ZeroDivisionError):
            pass
        out.append(k)
    return out
