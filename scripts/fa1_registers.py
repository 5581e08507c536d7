"""Registers a thread of the FlashAttention v1.0.9 kernels, as `ptxas -v` reports them: where
algorithms/flash1_kernel.py's FWD_REGISTERS and BWD_REGISTERS come from.

Compiles csrc/flash_attn/src/fmha_{fwd,bwd}_hdim{32,64,128}.cu of a flash-attention checkout at
tag v1.0.9 (its cutlass submodule at 319a389f) for one architecture, with three small stand-in
headers for the ATen names the sources include (a seed/offset struct and two declarations: no
PyTorch needed, and nothing they declare changes a kernel's registers). Prints, per kernel kind,
dispatched head dim and key block Bc, the largest count over the instantiations the FA2 paper's
runs use (fp16, no dropout, no softmax returned; causal or not, and the backward's loop-steps and
seq-parallel kernels), and whether it equals the table. Needs nvcc; about 3 minutes.

    git clone --branch v1.0.9 https://github.com/Dao-AILab/flash-attention fa
    git -C fa submodule update --init csrc/flash_attn/cutlass
    python scripts/fa1_registers.py fa --arch sm_80
"""
from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from hbmsim.algorithms.flash1_kernel import BWD_REGISTERS, FWD_REGISTERS

STUBS = {
    "ATen/cuda/CUDAGeneratorImpl.h": """#pragma once
#include <cstdint>
namespace at {
struct PhiloxCudaState {   // the seed and offset a dropout kernel reads
  union Payload { uint64_t val; int64_t* ptr; };
  Payload seed_{};
  Payload offset_{};
  uint32_t offset_intragraph_ = 0;
  bool captured_ = false;
};
}
""",
    "ATen/cuda/CUDAContext.h": """#pragma once
#include <cuda_runtime_api.h>
namespace at { namespace cuda { cudaDeviceProp* getCurrentDeviceProperties(); } }
""",
    "ATen/cuda/detail/UnpackRaw.cuh": """#pragma once
#include <tuple>
#include <ATen/cuda/CUDAGeneratorImpl.h>
namespace at { namespace cuda { namespace philox {
__host__ __device__ __forceinline__ std::tuple<uint64_t, uint64_t> unpack(at::PhiloxCudaState arg) {
  if (arg.captured_) {
    return std::make_tuple(static_cast<uint64_t>(*arg.seed_.ptr),
                           static_cast<uint64_t>(*(arg.offset_.ptr) + arg.offset_intragraph_));
  }
  return std::make_tuple(arg.seed_.val, arg.offset_.val);
}
} } }
""",
}
# the flags of the v1.0.9 setup.py's nvcc line that can change code generation
NVCC_FLAGS = ["-std=c++17", "-O3", "-U__CUDA_NO_HALF_OPERATORS__", "-U__CUDA_NO_HALF_CONVERSIONS__",
              "--expt-relaxed-constexpr", "--expt-extended-lambda", "--use_fast_math", "-Xptxas", "-v"]
ENTRY = re.compile(r"Compiling entry function '(\S+)' for")
USED = re.compile(r"Used (\d+) registers")
# the mangled FMHA_kernel_traits<S, D, ...> and the kernel's template flags after it
TRAITS = re.compile(r"FMHA_kernel_traitsILi(\d+)ELi(\d+)E")


def compile_one(src: Path, include: list, arch: str, out: Path) -> str:
    cmd = ["nvcc", *NVCC_FLAGS, f"-arch={arch}", "-c", str(src), "-o", str(out), *[f"-I{i}" for i in include]]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"fa1_registers: nvcc failed on {src.name}:\n{done.stderr[-2000:]}")
    return done.stderr + done.stdout


def kernels(log: str):
    """(mangled name, registers) for each entry function in a ptxas -v log."""
    name = None
    for line in log.splitlines():
        m = ENTRY.search(line)
        if m:
            name = m.group(1)
            continue
        m = USED.search(line)
        if m and name:
            yield name, int(m.group(1))
            name = None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkout", type=Path, help="flash-attention at tag v1.0.9, its cutlass submodule initialised")
    ap.add_argument("--arch", default="sm_80")
    args = ap.parse_args(argv)
    src = args.checkout / "csrc" / "flash_attn" / "src"
    cutlass = args.checkout / "csrc" / "flash_attn" / "cutlass" / "include"
    if shutil.which("nvcc") is None:
        print("fa1_registers: nvcc is not on PATH (the CUDA toolkit's compiler; no GPU needed)", file=sys.stderr)
        return 2
    if not (src / "fmha_fwd_hdim128.cu").is_file() or not cutlass.is_dir():
        print(f"fa1_registers: {args.checkout} is not a flash-attention v1.0.9 checkout with its cutlass submodule",
              file=sys.stderr)
        return 2
    found: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        stubs = Path(tmp) / "stubs"
        for rel, text in STUBS.items():
            (stubs / rel).parent.mkdir(parents=True, exist_ok=True)
            (stubs / rel).write_text(text)
        files = [f"fmha_{p}_hdim{d}.cu" for p in ("fwd", "bwd") for d in (32, 64, 128)]
        with ThreadPoolExecutor(2) as pool:
            logs = pool.map(lambda f: (f, compile_one(src / f, [src, cutlass, stubs], args.arch, Path(tmp) / f"{f}.o")),
                            files)
            for f, log in logs:
                hdim = int(re.search(r"hdim(\d+)", f).group(1))
                for name, regs in kernels(log):
                    if "dot_do_o" in name:         # (its own small kernel: DOT_DO_O_REGISTERS)
                        continue
                    traits = TRAITS.search(name)
                    bc = int(traits.group(1))
                    # the kernel's bool template arguments after its traits: Is_dropout, Is_causal
                    # (and the forward's Return_softmax); fp16 (`__half`), no dropout, no softmax returned
                    bools = re.findall(r"Lb([01])E", name[traits.end():])
                    kind = "forward" if "fwd" in f else "backward"
                    if "6__half" not in name or bools[0] == "1" or (kind == "forward" and bools[2] == "1"):
                        continue
                    found[(kind, hdim, bc)] = max(found.get((kind, hdim, bc), 0), regs)
    ok = True
    for (kind, hdim, bc), regs in sorted(found.items()):
        table = (FWD_REGISTERS if kind == "forward" else BWD_REGISTERS).get((hdim, bc))
        same = "=" if table == regs else f"table {table}"
        ok &= table == regs
        print(f"{kind:8s} head dim {hdim:3d}  Bc {bc:3d}: {regs:3d} registers a thread  ({same})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
