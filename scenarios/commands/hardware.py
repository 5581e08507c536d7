"""`hbmsim hardware [NAME]`: the hardware presets, or one with the source of every figure."""
from __future__ import annotations

from hbmsim.simulator import load_gpu

from ..experiment import HARDWARE_DIR, preset_names, resolve_hardware


def add_parser(sub) -> None:
    h = sub.add_parser("hardware", help="list hardware presets, or show one with its sources")
    h.add_argument("name", nargs="?", help="a preset's name (see the list) or a hardware TOML file")
    h.set_defaults(func=cmd_hardware)


def cmd_hardware(args) -> int:
    if args.name:
        gpu = resolve_hardware(args.name)
        summary = gpu.summary()
        width = max(map(len, summary))
        for key, value in summary.items():
            print(f"{key:{width}s} {value!s:>18s}   {gpu.source.get(key, '(no source given)')}")
        return 0
    print(f"{'preset':18s} {'SMs':>4s} {'clock':>9s} {'HBM':>10s} {'SRAM/SM':>9s} {'L2':>8s} {'tensor':>12s}")
    for name in preset_names():
        g = load_gpu(HARDWARE_DIR / f"{name}.toml")
        print(f"{name:18s} {g.sm_count:4d} {g.clock_hz / 1e9:6.2f} GHz {g.hbm_bytes_per_s / 1e12:6.3f} TB/s "
              f"{g.sram_bytes_per_sm / 1024:6.0f} KiB {g.l2_bytes / 2**20:5.0f} MiB "
              f"{g.matmul_flops_per_s / 1e12:7.0f} TFLOP/s")
    return 0
