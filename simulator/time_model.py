"""The time model: how long one `compute` call keeps an SM busy, and which DRAM rate HBM serves at.

Each effect is a physical reason why a GPU runs slower than its spec sheet, with its number in
the hardware preset (and the preset's [source] table saying where the number comes from). Each
can be switched off (`TimeModel(sfu_exp=False)`, `hbmsim validate --ablation`) to see how much of
the predicted time it explains. Nothing here is fitted to a measurement.

- stream_dram: DRAM serves at the fraction of the spec sheet's `hbm_bytes_per_s` that a
  STREAM-like kernel reaches (`hbm_stream_fraction`, 86-89% on A100 and H100): refresh,
  read/write turnarounds and bank conflicts are never avoided.
- achievable_tensor: the tensor cores deliver the fraction of the spec sheet's peak that the
  best measured GEMM reaches (`tensor_achievable_fraction`; A100: cuBLAS at 92%): operand
  delivery, issue and clock never let a real kernel run the pipes at 100%.
- mma_sync: a kernel written with the warp-level `mma.sync` instruction (FlashAttention 1 and 2;
  Launch.tensor_op = "mma.sync") gets `mma_sync_fraction` of `matmul_flops_per_s` from the
  tensor cores (or the achievable fraction, if that is smaller: both are fractions of the peak).
  On A100 that is all of it (mma.sync is sm80's tensor-core instruction); on H100 the peak needs
  the warpgroup-level `wgmma`, and mma.sync reaches about 2/3 of it (measured: 0.664). Library GEMMs
  (cuBLAS) use the best instruction: `matmul_flops_per_s` (times the achievable fraction).
- sfu_exp: exp runs on the special-function unit (`sfu_ops_per_clk_per_sm`: 16 results per clock
  per SM on sm80 and sm90, at `clock_hz`), not at the FP32 rate; each `compute` call says how
  many exps it does (`exp_ops`, a part of its `vector_flops`).
- fp32_ops: the FP32 peak counts a fused multiply-add as 2 FLOPs, but softmax's max, add,
  multiply and conversions are one operation each in one lane-clock: the vector work the
  programs count (one per operation) runs at `vector_flops_per_s / 2` operations per second.
- instruction_issue: a kernel whose vector work is a measured instruction count
  (Launch.vector_work = "instructions": PyTorch's elementwise, copy and softmax kernels, whose
  index arithmetic, shuffles and conversions Nsight Compute counted per element) is bound by
  the warp schedulers, which issue one warp instruction (32 lanes) per clock each
  (`warp_instructions_per_clk_per_sm`: four per SM on A100 and H100, their whitepapers' SM
  diagrams: "Warp Scheduler (32 thread/clk)" in each of four partitions), not by the FP32 lanes:
  the instructions are integer, memory, shuffle and special-function ones as much as FP32 ones.
  On H100 the two rates are the same (128 FP32 lanes per SM); on A100 the issue rate is twice
  the FP32 one (64 lanes). Off, or on a GPU whose preset does not give the field: the FP32 rate.
- l2_sectors: a tile read one element a request (tensor.GATHER: PyTorch's transposing copies)
  takes the L2's bandwidth for every 32-byte sector it requests, 16x an fp16 tile's bytes, not
  for its bytes alone (CUDA C++ Best Practices Guide, "Coalesced Access to Global Memory": a
  warp's accesses are served in 32-byte sectors; Nsight Compute's lts__t_sectors counts them).
  Each request takes the preset's `l2_sector_request_bytes` of the pipe (32, the sector itself,
  until the L2's rate for lone sectors is measured: `hbmsim microbench`, l2_sector_cost_bytes).
  The counts are the sectors either way; off, the L2's pipe serves such a tile's bytes only.
- serial_softmax: inside a warp, FlashAttention's softmax needs S from the GEMM before it and
  the next GEMM needs P from it, so a block's tensor-core work (overlapped with its shared-memory
  reads, which are software-pipelined) and its vector/SFU work (FP32 and SFU overlap, being
  independent operations on different units) add up instead of overlapping. Overlap across the
  blocks resident on an SM is another effect's (mma_sync_pipes; sm_pipes for wgmma kernels).
- mma_operands: on a GPU whose preset says so (`mma_sync_operands_serial`, measured on H100), an
  mma.sync kernel's shared-memory operand reads (ldmatrix) and its mma.sync instructions add up
  instead of the reads hiding under the tensor cores. Nsight Compute on H100 found the tensor pipe
  and the shared-memory pipe busy for 105-113% of FlashAttention-2's kernel time together
  (scenarios/measured/h100-ncu-kernels.json): they hardly overlap. Library GEMMs (wgmma reads its
  operands from shared memory itself) keep the overlap. Not measured on A100, where it stays off.
- registers: an SM holds only as many blocks as its register file (`registers_per_sm`) has room
  for, given the compiled kernel's threads per block and registers per thread
  (Launch.registers_per_thread); FlashAttention-2's kernels use 255 registers a thread, so an
  H100 or A100 SM holds 2 forward blocks (4 warps each) and 1 backward block (8 warps), fewer
  than shared memory alone allows. Fewer resident blocks leave less of one block's softmax to
  run under another's GEMMs (machine.py: slots per SM).
- sm_pipes: for kernels built on Hopper's asynchronous `wgmma` (Launch.tensor_op = "wgmma":
  FlashAttention-3), an SM's tensor cores and its FP32/SFU lanes are separate pipes. A compute
  call occupies the tensor pipe for its GEMM and then, where its softmax depends on that GEMM
  (serial_softmax), the vector pipe for its vector/SFU time; another warp role's GEMM runs on
  the tensor pipe meanwhile (wgmma.mma_async returns before the tensor core is done: PTX ISA,
  "Asynchronous Warpgroup Level Matrix Multiply-Accumulate"; FlashAttention-3 paper, section
  3.1: ping-pong puts one warpgroup's softmax under the other's GEMMs). Synchronous mma.sync
  kernels: mma_sync_pipes. Off: one pipe for every wgmma kernel.
- pipe_sharing (with sm_pipes): the two pipes of a wgmma kernel's SM are shared by processor
  sharing instead of served first come, first served: the requests of different warp roles
  (warpgroups) in flight on a pipe share its rate equally, as the SM's four warp schedulers
  interleave the instructions of their resident warps (one warp instruction per scheduler per
  cycle, round robin among ready warps: H100 whitepaper, "H100 SM architecture"; CUDA C++
  Programming Guide, "SIMT Architecture"); one role's requests on a pipe are served in its
  program order (a warp issues in order). FIFO pipes let a warpgroup's whole GEMM finish before
  the next one starts, which hides the other warpgroups' softmax more than the hardware does
  (FIFO: FA3's backward and FP8 forward predicted 16% and 21% too fast against the FA3 paper,
  median; with sharing 6% and 15%: docs/validation.md). shared_pipes.py.
  Off: FIFO pipes.
- xu_tensor_serial: on a wgmma kernel's SM, the softmax's special-function (XU) work and the
  tensor pipe's GEMMs do not run at the same time, whatever the warp roles: the sm_pipes
  overlap (and pipe_sharing) is not there. Measured: Nsight Compute on cuDNN's sm90 attention
  forward (a warp-specialised TMA + wgmma kernel, 3 warpgroups) on an H200, N = 4096
  (scenarios/measured/h200-ncu-hopper.json, h200-ncu-pipes.json): the tensor pipe's active
  cycles plus the XU pipe's issue make 102.7% of the kernel's cycles at head dim 64 (50.5 +
  52.2), 102.2% at 256 (81.2 + 21.0) and 114.2% at 128 (75.3 + 38.9): one after the other, but
  for a seventh of the time at 128; an H100 gave 102.7, 114.2 and 101.9% (h100-ncu-*.json).
  The FlashAttention-3 paper's own forward throughput at 16k tokens (497, 648, 756 TFLOP/s at
  head dims 64, 128, 256) is the serial sum's at the spec peak (495, 659, 791:
  scripts/fa3_serial_bound.py), not the overlapped one's (989 at every head dim). The FP32
  (FMA) pipe still runs beside them (the call's vector time is max(FP32, SFU), as everywhere).
  Off: sm_pipes and pipe_sharing decide.
- wgmma_full_rate: a wgmma kernel's tensor pipe delivers the spec sheet's peak while it is busy,
  not the achievable fraction of cuBLAS's best GEMM: Nsight Compute counts cuDNN's sm90
  attention's wgmma FLOPs (sm__ops_path_tensor_op_hgmma_src_fp16_sparsity_off) at 96-98% of the
  peak per clock over the tensor pipe's active cycles, forward and backward (49.3 of 50.5%, 72.4
  of 75.3%, 78.3 of 81.2%; backward 49.8 of 51.3%, 63.6 of 66.0%). The achievable fraction
  (0.70 on the H200) is a GEMM's that draws the board to its power cap (sw_power_cap in
  h200-torch-hopper.json's gemm clock samples); the attention kernels at N = 4096 ran at 1980
  MHz with no clock reason. Library GEMMs keep the fraction. Off: wgmma at the achievable
  fraction.
- mma_sync_pipes: on a GPU whose preset measured mma.sync's operand reads serial with it
  (`mma_sync_operands_serial`: H100, H200), an mma.sync kernel's SM has two pipes as sm_pipes
  draws them: the tensor pipe holds a call's mma.sync and its ldmatrix reads (mma_operands), the
  vector pipe its softmax, after them (serial_softmax); so one resident block's softmax runs while
  another block's GEMMs do, first come first served (the warp schedulers pick whichever resident
  warp is ready: with two 4-warp blocks an SM sub-partition holds a warp of each). Measured:
  Nsight Compute on FA2's forward (two blocks an SM, N = 4096) counts the tensor and shared-memory
  pipes busy 105% of the cycles together at head dim 128 (56.7 + 48.3%, H100 and H200), the XU
  (20%) and FMA (18%) pipes beside them (h100-ncu-kernels.json, h200-ncu-stalls.json); and one wave
  of FA2's forward, one 128-row tile an SM against two (`--tiles-per-sm 1 2`,
  h100/h200-torch-one-wave.json), takes 1.67-1.71x as long with two resident blocks at head dim
  128 (N >= 1536; predicted 1.70, one pipe 2.00) and 1.52-1.64x at 64 (predicted 1.47).
  Off, or on a GPU whose preset does not say so (A100: not measured): one pipe, the blocks' calls
  one after the other.
- warp_issue: on a GPU whose preset measured mma.sync's operand reads serial with it (H100, H200),
  an mma.sync kernel that gives its warps' instructions (Launch.warp_instructions: per GEMM FLOP,
  per ldmatrix byte and per vector operation; FA2's forward: its mma.sync and ldmatrix shapes, and
  the rest of Nsight Compute's smsp__inst_executed, 1,682 / 1,220 / 916 a warp a K/V step at head
  dims 64 / 128 / 256, over the step's softmax) issues them at `warp_instructions_per_clk_per_sm`
  after its GEMM's tensor-pipe time (the longer of mma.sync's and the ldmatrix reads', which
  pipeline across warps), the SM's resident blocks one after another: a call takes the SM's pipe
  for max(mma, ldmatrix) + instructions / 4 a clock, and its block waits at least its own dependent
  chain (mma_operands and serial_softmax: the mma_sync_pipes call). Measured: over every Nsight
  profile of FA2's forward with two resident blocks at N = 4096 (H100 and H200), cycles a score
  are the tensor pipe's active cycles plus the warp instructions at four a clock (head dim 64:
  0.0965 + 0.4132 / 4 = 0.1998 against 0.2001; 128: 0.3438 against 0.341), not the larger of the
  two, and at 256, where the shared-memory pipe is the longer (0.576 a score), its cycles plus
  the issue (0.803 against 0.747); and two resident blocks take 2 x that sum over a lone block's
  cycles, 1.58 and 1.70 of one block's time, against 1.59 and 1.67-1.71 measured (one wave,
  h100/h200-torch-one-wave.json). One mechanism that fits, not published by NVIDIA: the two
  blocks' warps reach their GEMMs and their softmax together, a round-robin issue order keeping
  alike warps in phase (docs/validation.md, "FA2's forward: the warps' issue"). Off, or for a
  launch without the count: mma_sync_pipes.
- block_dispatch: a launch's first blocks start one after another, `block_dispatch_s` apart, as a
  GPU's block scheduler hands them out, round robin over the SMs (slot k of SM i is the (k x SMs +
  i)-th, and starts that many staggers after the launch). Without it a launch of alike blocks
  starts every SM at the same instant and can run in exact lock-step (every SM loading at once,
  then computing at once) until rounding breaks the symmetry at a point no physics sets; with
  DRAM's measured 350 ns latency, lock-step put decode's batch-8 split kernel 13-24% slow at
  N >= 32k (every SM's loads in phase). Measured on an H100 and an H200 (`hbmsim microbench
  --host`, h100-host.json, h200-host.json: per_block_s): a wave's 264 blocks start within one
  0.24 us tick of the global timer, 0.9 ns a block, the timer's reading and an upper bound (the
  tick is coarser than the spread); the presets give that (docs/validation.md, "The block
  scheduler's stagger"). Not measured on the A100s: 0. Off, or at 0: every block of the first
  wave starts at once.
- l2_hit_latency: a load served by the L2 waits the preset's `l2_hit_latency_s` after its bytes
  are served, as one served by DRAM waits `hbm_latency_s`. Measured (`hbmsim microbench`,
  pointer_chase: one thread, each load's address the last one's value): 149 ns (290.6 cycles) on
  an H100, 146 ns (286.8 cycles) on an H200 (h100-latency.json, h200-latency.json). A program that
  prefetches (cp.async, TMA) hides it under its compute; a dependent loop pays it a trip: FA2's
  split-KV combine kernel loads split after split into one register tile (a runtime trip count,
  not unrolled), 0.21 us a split in its kernel rows at boost and base clocks alike (Nsight,
  h100/h200-ncu-decode.json: 77-82% L2 hits, long-scoreboard stalls). Off, or 0 (the A100
  presets: not measured): an L2 hit costs its bytes at the L2's rate only.
- l2_dirty_limit: the L2 holds at most the preset's `l2_dirty_fraction` of its bytes dirty; past
  that, the least recently stored dirty lines go to DRAM while the kernel runs (l2.py), in its
  DRAM traffic and time, instead of waiting in the L2 for an eviction or the program's end.
  Measured (kernels/store_retention.py under Nsight Compute, the L2 flushed before each kernel):
  a store-only kernel of 48-256 MiB ends with 23.2-23.7 MiB dirty on an H100 (50 MiB L2) and
  27.7-27.9 MiB on an H200 (60 MiB), the rest of its stores written while it ran; a copy kernel
  (its reads in the L2 too) 19.8-22.2 and 23.2-25.9 MiB (h100/h200-l2-store-retention.json).
  0.47 and 0.46 of the L2, about the same fraction on both.
  Not measured on the A100s: 0. Off, or 0: the whole L2 may be dirty.
- fixed_chain: a kernel block's fixed instructions (those it runs once, not a step: its prologue's
  and epilogue's address arithmetic, the output's conversion and staging; Nsight counted: FA2's
  forward 519, 817 and 912 a warp at head dims 64, 128 and 256, Launch programs name them) run as
  a dependent chain, each `dependent_issue_cycles` (4: CUDA C++ Programming Guide, "Multiprocessor
  Level") after the last, at `clock_hz`: a latency the block waits, taking no pipe, which the
  other resident blocks' work hides when it can. FA2's forward at two warps a scheduler issues a
  warp's instruction every 4.2 cycles over N = 4096 and 5.2 at N = 128 (Nsight,
  h100-ncu-kernels.json, h100-ncu-short.json): short blocks are latency-bound. Off, or 0: the
  fixed work is only what the program's compute calls count.
- named_barriers: a program's named barriers between the warp roles of a block (ctx.barrier: bar.sync
  over their threads, CUTLASS's NamedBarrier::sync) hold each role until all have reached them.
  FlashAttention-3's backward (hopper/mainloop_bwd_sm90_tma_gmma_ws.hpp, bwd_step, commit 0251105a)
  syncs every MMA thread once a step, after each consumer warpgroup has stored its part of dS and
  issued dV's GEMM, before the dQ GEMM that reads all of dS: the warpgroups meet every step, so
  their softmax phases run at the same time and not under each other's GEMMs. Off: the roles meet
  only where the program's own events (buffer slots) make them.
- host: a pass's time is what a stopwatch around it sees (host.py): the kernels behind the
  host's framework dispatch and kernel launches, with the launch queue letting the host run
  ahead; short passes of small kernels wait for the host. Off: the kernels' device time alone
  (a result's `kernel_time_s`, which every result gives either way).
- sdpa_call (with host): a measured call of torch's scaled_dot_product_attention (validate: an
  implementation timed through SDPA by this project's harness) pays SDPA's own host work before
  its first launch: argument checks, backend selection and allocations beyond the op, node and
  launches the host fields charge (host.HostSpec.sdpa_forward_s, sdpa_backward_s: measured on
  tiny calls, where the host's work is all a call costs, `hbmsim microbench --host`: 84.7 us a
  forward, 157.4 us a backward on an H100). Off: SDPA costs an op (a node) and its launches.

With every effect off, the model is the old one: DRAM at the spec sheet's rate and a compute
call as long as the slowest of its tensor-core, vector and SRAM times at the SM's peak rates.
(Phases a program chains with `compute_chain`, such as FA1's split-K reductions, still add up:
they are the program's dependencies, not an effect of the model.)
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .errors import HbmsimError

# Launch.tensor_op: what drives the tensor cores. "wgmma": Hopper's warpgroup-level instruction, the
# one library GEMMs and FlashAttention-3 use (its operand B straight from shared memory): the GPU's
# best instruction, at the library rate, operand reads overlapped.
MMA_SYNC, LIBRARY, WGMMA = "mma.sync", "library", "wgmma"
# "wgmma.fp8": wgmma on e4m3 operands (FlashAttention-3's FP8 forward), at the preset's FP8 peak
# (fp8_matmul_flops_per_s, twice the fp16 one on Hopper) times the same achievable fraction; a GPU
# without an FP8 peak runs it at the fp16 rate
WGMMA_FP8 = "wgmma.fp8"
TENSOR_OPS = (MMA_SYNC, LIBRARY, WGMMA, WGMMA_FP8)
# Launch.vector_work: "fp32", operations counted by the program (one per FP32 lane-clock), or
# "instructions", a measured instruction count x 32 lanes (issued at the schedulers' rate: instruction_issue)
FP32, INSTRUCTIONS = "fp32", "instructions"
VECTOR_WORK = (FP32, INSTRUCTIONS)
ASYNC_TENSOR_OPS = (WGMMA, WGMMA_FP8)     # asynchronous warpgroup MMA: the sm_pipes effect applies


@dataclass(frozen=True)
class TimeModel:
    """Which effects are on (all by default). `off(name)` gives the model without one."""
    stream_dram: bool = True
    achievable_tensor: bool = True
    mma_sync: bool = True
    sfu_exp: bool = True
    fp32_ops: bool = True
    instruction_issue: bool = True
    l2_sectors: bool = True
    serial_softmax: bool = True
    registers: bool = True
    mma_operands: bool = True
    sm_pipes: bool = True
    pipe_sharing: bool = True
    xu_tensor_serial: bool = True
    wgmma_full_rate: bool = True
    mma_sync_pipes: bool = True
    warp_issue: bool = True
    block_dispatch: bool = True
    l2_hit_latency: bool = True
    l2_dirty_limit: bool = True
    fixed_chain: bool = True
    named_barriers: bool = True
    host: bool = True
    sdpa_call: bool = True
    # the host's fields (host.HostSpec) measured by `hbmsim microbench --host` (host_from_measured);
    # None: host.DEFAULT_HOST, from public figures
    host_spec: object = None

    @staticmethod
    def effects() -> tuple:
        return tuple(f.name for f in dataclasses.fields(TimeModel) if f.name != "host_spec")

    def off(self, *names: str) -> "TimeModel":
        for name in names:
            if name not in self.effects():
                raise HbmsimError(f"unknown time-model effect '{name}' (known: {', '.join(self.effects())})")
        return dataclasses.replace(self, **{n: False for n in names})

    def describe(self) -> str:
        off = [n for n in self.effects() if not getattr(self, n)]
        text = "all effects on" if not off else "off: " + ", ".join(off)
        return text + ("; host fields measured" if self.host_spec is not None and self.host else "")


BASELINE = TimeModel(**{n: False for n in TimeModel.effects()})    # the spec-sheet model
# effects the stopwatch applies after the simulation (host.py), which no simulated time depends on:
# models that differ only in them simulate alike
HOST_EFFECTS = ("host", "sdpa_call")


def hbm_rate(gpu, model: TimeModel) -> float:
    """The DRAM bandwidth the HBM pool serves at (bytes/s, whole GPU)."""
    if model.stream_dram and gpu.hbm_stream_fraction > 0:
        return gpu.hbm_bytes_per_s * gpu.hbm_stream_fraction
    return gpu.hbm_bytes_per_s


class SmRates:
    """Seconds per unit of work on one SM, precomputed once per machine (the hot path multiplies)."""

    __slots__ = ("s_per_flop", "s_per_vec_op", "s_per_exp", "s_per_sram_byte", "serial", "operands_add", "pipes",
                 "two_pipe_ops", "s_per_warp_instruction", "_known")
    # s_per_vec_op: seconds per unit of vector work on one SM, by Launch.vector_work
    KNOWN_MAX = 4096      # compute calls remembered (programs repeat a few tile shapes many times)

    def __init__(self, gpu, model: TimeModel):
        sms = gpu.sm_count
        # tensor cores: seconds per FLOP for each kind of instruction
        # each instruction's rate is a fraction of the spec sheet's peak: the best GEMM's (achievable)
        # for library GEMMs; for mma.sync the smaller of that and mma.sync's own measured ceiling
        # (both are measured against the peak, so they do not multiply)
        peak = gpu.matmul_flops_per_s
        achievable = gpu.tensor_achievable_fraction if model.achievable_tensor and gpu.tensor_achievable_fraction > 0 \
            else 1.0
        mma_sync = gpu.mma_sync_fraction if model.mma_sync and gpu.mma_sync_fraction > 0 else 1.0
        fp8_peak = getattr(gpu, "fp8_matmul_flops_per_s", 0.0) or peak
        # wgmma_full_rate: an attention kernel's wgmma at the peak (the achievable fraction is cuBLAS's)
        wgmma = 1.0 if model.wgmma_full_rate else achievable
        self.s_per_flop = {LIBRARY: sms / (peak * achievable), WGMMA: sms / (peak * wgmma),
                           WGMMA_FP8: sms / (fp8_peak * wgmma),
                           MMA_SYNC: sms / (peak * min(achievable, mma_sync))}
        # FP32 lanes: vector_flops_per_s counts an FMA as 2 FLOPs; one counted operation is one lane-clock
        fp32_s = sms / (gpu.vector_flops_per_s / 2 if model.fp32_ops else gpu.vector_flops_per_s)
        # instruction_issue: one warp instruction (32 lanes) per scheduler per clock
        issue = gpu.warp_instructions_per_clk_per_sm * 32 * gpu.clock_hz       # lane-instructions/s on one SM
        self.s_per_vec_op = {FP32: fp32_s,
                             INSTRUCTIONS: 1.0 / issue if model.instruction_issue and issue > 0 else fp32_s}
        # SFU: 0 means exp is an ordinary vector operation (the effect off or no rate given)
        sfu = gpu.sfu_ops_per_clk_per_sm * gpu.clock_hz          # exps per second on one SM
        self.s_per_exp = 1.0 / sfu if model.sfu_exp and sfu > 0 else 0.0
        self.s_per_sram_byte = 1.0 / gpu.sram_bytes_per_s_per_sm
        self.serial = model.serial_softmax
        # tensor and vector pipes apart (machine.py keeps two per SM), unless xu_tensor_serial says they
        # do not overlap
        self.pipes = model.sm_pipes and not model.xu_tensor_serial
        # a GPU whose preset measured mma.sync's operand reads serial with it (mma_sync_operands_serial)
        operands_serial = model.mma_sync and gpu.mma_sync_fraction > 0 and gpu.mma_sync_operands_serial > 0
        self.operands_add = model.mma_operands and operands_serial
        # the tensor ops whose kernels get the two pipes: wgmma's (sm_pipes), and mma.sync's where its
        # operand reads are serial (mma_sync_pipes: the softmax beside the other resident blocks' GEMMs)
        self.two_pipe_ops = frozenset((ASYNC_TENSOR_OPS if self.pipes else ())
                                      + ((MMA_SYNC,) if model.mma_sync_pipes and operands_serial else ()))
        # warp_issue: seconds an SM takes to issue one warp instruction (its schedulers, one each a clock);
        # 0: the effect off, or a GPU without mma.sync's measured serial operand reads or without the rate
        warp_issue = model.warp_issue and operands_serial and gpu.warp_instructions_per_clk_per_sm > 0
        self.s_per_warp_instruction = 1.0 / (gpu.warp_instructions_per_clk_per_sm * gpu.clock_hz) \
            if warp_issue else 0.0
        self._known: dict = {}    # compute_s's arguments -> its result

    def compute_s(self, tensor_op: str, matmul_flops: int, vector_flops: int, exp_ops: int,
                  sram_bytes: int, vector_work: str = FP32) -> tuple:
        """(tensor-pipe s, vector-pipe s) that one compute call of a kernel whose tensor cores run
        `tensor_op` (and whose vector work counts `vector_work`) takes on its SM (remembered: the
        same call, the same times). How the two combine is the machine's (sm_pipes) or `call_s`."""
        args = (tensor_op, matmul_flops, vector_flops, exp_ops, sram_bytes, vector_work)
        work_s = self._known.get(args)
        if work_s is None:
            if len(self._known) >= self.KNOWN_MAX:
                self._known.clear()
            work_s = self._known[args] = self._compute_s(*args)
        return work_s

    @staticmethod
    def call_instructions(counts: tuple, matmul_flops: int, sram_bytes: int, vector_flops: int) -> float:
        """The warp instructions of one compute call, from a kernel's counts a unit of work
        (Launch.warp_instructions: per GEMM FLOP, per shared-memory byte, per vector operation)."""
        per_flop, per_sram_byte, per_vector_op = counts
        return matmul_flops * per_flop + sram_bytes * per_sram_byte + vector_flops * per_vector_op

    def issue_s(self, matmul_flops: int, sram_bytes: int, vector_flops: int, counts: tuple) -> float:
        """warp_issue: the SM's time for one mma.sync call of a kernel that gives its instructions
        (`counts`, call_instructions'): the longer of its mma.sync and its ldmatrix reads (pipelined
        across the warps), then the issue of all its warps' instructions (mma, ldmatrix, softmax,
        address arithmetic alike)."""
        mma_s = matmul_flops * self.s_per_flop[MMA_SYNC]
        sram_s = sram_bytes * self.s_per_sram_byte
        instructions = self.call_instructions(counts, matmul_flops, sram_bytes, vector_flops)
        return (mma_s if mma_s > sram_s else sram_s) + instructions * self.s_per_warp_instruction

    def call_s(self, tensor_s: float, vector_s: float) -> float:
        """One call's time on an SM with one pipe (sm_pipes off): its parts added where the
        softmax depends on the GEMM (serial_softmax), overlapped otherwise."""
        return tensor_s + vector_s if self.serial else max(tensor_s, vector_s)

    def _compute_s(self, tensor_op: str, matmul_flops: int, vector_flops: int, exp_ops: int,
                   sram_bytes: int, vector_work: str) -> tuple:
        mma_s, sram_s = matmul_flops * self.s_per_flop[tensor_op], sram_bytes * self.s_per_sram_byte
        if self.operands_add and tensor_op == MMA_SYNC:
            tensor_s = mma_s + sram_s       # mma_operands: ldmatrix and mma.sync, one after the other
        else:
            tensor_s = max(mma_s, sram_s)   # operand reads pipelined under the tensor cores
        s_per_vec_op = self.s_per_vec_op[vector_work]
        if self.s_per_exp:
            vector_s = max(max(vector_flops - exp_ops, 0) * s_per_vec_op, exp_ops * self.s_per_exp)
        else:
            vector_s = vector_flops * s_per_vec_op
        return tensor_s, vector_s
