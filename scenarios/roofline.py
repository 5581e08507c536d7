"""The roofline of a run: the machine's roofs and every kernel placed by its arithmetic intensity
(FLOPs per DRAM byte) and its achieved FLOP/s, from the counters of a real (simulated) run.

Roofs (from the hardware preset and the time model): the tensor-core peak (and what mma.sync
reaches, where the preset says), the FP32 peak, the exp rate of the special-function units, and
the DRAM slope at the spec sheet's and at the STREAM bandwidth. A kernel on the slope is
memory-bound (standard attention's elementwise kernels); one near a flat roof is compute-bound
(flash attention). Decode kernels (a few query rows against a longer KV cache: phase_of) are
drawn as triangles beside prefill's circles: at about heads / kv_heads FLOPs per K/V element they
sit on the DRAM slope. All kernel points are predicted by hbmsim.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hbmsim.simulator import GPU

from .outputs import pyplot, save_figure


@dataclass(frozen=True)
class KernelPoint:
    label: str                 # "algorithm pass kernel (N=...)"
    flops: int                 # matmul + vector operations
    dram_bytes: int
    time_s: float
    phase: str = "prefill"     # "decode": a few query rows (<= DECODE_MAX_Q) against a longer KV cache

    @property
    def intensity(self) -> float:
        """FLOPs per DRAM byte (inf for a kernel that moved no DRAM byte)."""
        return self.flops / self.dram_bytes if self.dram_bytes else float("inf")

    @property
    def flops_per_s(self) -> float:
        return self.flops / self.time_s if self.time_s > 0 else 0.0


DECODE_MAX_Q = 16        # issue 25: decode is 1-16 query rows per sequence against a long KV cache


def phase_of(workload: dict) -> str:
    """"decode" for a few query rows against a longer KV cache, else "prefill"."""
    nq, nk = workload.get("seq_len_q"), workload.get("seq_len_kv")
    return "decode" if nq is not None and nk is not None and nq <= DECODE_MAX_Q and nq < nk else "prefill"


def kernel_points(results: list[dict]) -> list[KernelPoint]:
    """One point per kernel of each result (the per-pass results; the forward+backward total is
    skipped, its kernels being those of its passes). Kernels with no FLOPs (copies, write-backs)
    cannot be placed on a log FLOP/s axis and are left out."""
    out = []
    for r in results:
        if r["pass"] == "forward+backward":
            continue
        w = r["workload"]
        n, phase = w.get("seq_len_q"), phase_of(w)
        if phase == "decode":
            n = f"{n}x{w.get('seq_len_kv')}"
        for k in r["kernels"]:
            flops = k["matmul_flops"] + k["vector_flops"]
            dram = k["hbm_read_bytes"] + k["hbm_write_bytes"]
            if flops > 0 and k["time_s"] > 0:
                out.append(KernelPoint(f"{r['algorithm']} {r['pass']} {k['name']} (N={n})", flops, dram, k["time_s"],
                                       phase))
    return out


def roofs(gpu: GPU) -> dict:
    """{name: FLOP/s} flat roofs and {name: bytes/s} slopes of `gpu`."""
    flat = {"tensor cores (peak)": gpu.matmul_flops_per_s}
    if 0 < gpu.mma_sync_fraction < 1:
        flat["tensor cores with mma.sync"] = gpu.matmul_flops_per_s * gpu.mma_sync_fraction
    flat["FP32 (peak)"] = gpu.vector_flops_per_s
    if gpu.sfu_ops_per_clk_per_sm > 0:
        flat["exp on the SFU (exps/s)"] = gpu.sfu_ops_per_clk_per_sm * gpu.sm_count * gpu.clock_hz
    slopes = {"DRAM (spec sheet)": gpu.hbm_bytes_per_s}
    if gpu.hbm_stream_fraction > 0:
        slopes["DRAM (STREAM)"] = gpu.hbm_bytes_per_s * gpu.hbm_stream_fraction
    return {"flat": flat, "slopes": slopes}


def plot(results: list[dict], gpu: GPU, path: str | Path, title: str) -> Path:
    plt = pyplot()
    pts = [p for p in kernel_points(results) if p.dram_bytes > 0]
    r = roofs(gpu)
    xs = [p.intensity for p in pts] or [1.0]
    lo, hi = min(min(xs) / 4, 0.1), max(max(xs) * 4, 1e4)
    fig, ax = plt.subplots(figsize=(8.5, 6.5))
    top = max(r["flat"].values())
    styles = ("-", "--", "-.", ":")
    for (name, rate), ls in zip(r["flat"].items(), styles):
        ax.plot([lo, hi], [rate, rate], color="black", ls=ls, lw=1, label=f"{name}: {rate / 1e12:.3g} T/s")
    for (name, bw), ls in zip(r["slopes"].items(), ("-", "--")):
        ax.plot([lo, hi], [bw * lo, bw * hi], color="tab:gray", ls=ls, lw=1,
                label=f"{name}: {bw / 1e12:.3g} TB/s x intensity")
    colours = {}
    palette = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
    markers = {"prefill": "o", "decode": "^"}     # decode points alongside prefill, told apart by shape
    for p in pts:
        kernel = p.label.split(" (N=")[0] + f" ({p.phase})"
        if kernel not in colours:
            colours[kernel] = palette[len(colours) % len(palette)]
            ax.scatter([], [], color=colours[kernel], marker=markers[p.phase], label=kernel, s=25)
        ax.scatter(p.intensity, p.flops_per_s, color=colours[kernel], marker=markers[p.phase], s=25, alpha=0.6)
    ax.set(xscale="log", yscale="log", xlim=(lo, hi), ylim=(min([p.flops_per_s for p in pts] + [top]) / 10, top * 3),
           xlabel="arithmetic intensity (FLOPs per DRAM byte)",
           ylabel="achieved FLOP/s (matmul + vector operations)")
    ax.set_title(title + "\nkernels: predicted by hbmsim (simulated, not measured); roofs: hardware preset", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=6.5, loc="lower right")
    return save_figure(fig, path)
