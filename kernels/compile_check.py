"""Compile the CUDA kernels with nvcc for a GPU architecture, without a GPU, and report what
ptxas says each kernel uses: registers, static shared memory, spills, stack.

Two steps, both from the CUDA toolkit: `nvcc -ptx -arch=sm_XX` (front end) and
`ptxas -arch=sm_XX -v` (assembler; its "Used N registers, ... M bytes smem" lines are parsed).
The flash kernel's shared memory is dynamic, so ptxas's figure is its static part (0); the
dynamic part, FlashSmem<...>::bytes from the kernel source, is read back from constants the
generated translation unit places in the PTX. Reports are cached like the emulation builds.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterable

from hbmsim.simulator import HbmsimError

from .config import FLASH_SOURCE, KERNEL_DIR, SOFTMAX_SOURCE, KernelConfig
from .emulation import cache_dir
from .gpu import SOFTMAX_THREADS

_USED = re.compile(r"Used (\d+) registers(?:, used (\d+) barriers)?(?:, (\d+) bytes smem)?")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(sm_\d+a?)'")
_FLASH = re.compile(r"flash_attention_forwardI(4fp16|f)Li(\d+)ELi(\d+)ELi(\d+)E")
_SOFTMAX = re.compile(r"softmax_rowsI(4fp16|f)Li(\d+)E")
_SMEM_CONST = re.compile(r"\.u32 hbmsim_dynamic_smem_(\d+) = (\d+);")


@dataclass(frozen=True)
class KernelResources:
    kernel: str                  # C++ name, e.g. flash_attention_forward<fp16, 64, 64, 64>
    arch: str
    registers: int               # per thread
    static_smem_bytes: int       # ptxas's "bytes smem"
    dynamic_smem_bytes: int      # what the launcher passes (flash: FlashSmem<...>::bytes)
    stack_bytes: int
    spill_store_bytes: int
    spill_load_bytes: int

    @property
    def smem_bytes(self) -> int:
        return self.static_smem_bytes + self.dynamic_smem_bytes


def find_nvcc() -> str | None:
    for cand in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if cand and Path(cand).is_file():
            return cand
    return None


def find_ptxas(nvcc: str) -> str | None:
    beside = Path(nvcc).resolve().parent / "ptxas"
    return str(beside) if beside.is_file() else shutil.which("ptxas")


def _type(mangled: str) -> str:
    return "fp16" if mangled == "4fp16" else "float"


def translation_unit(configs: list[KernelConfig], softmax: bool) -> str:
    lines = ['#include "flash_attention.cu"']
    for i, c in enumerate(configs):
        t = c.template_args.split(",")[0]
        lines.append(f"template __global__ void flash_attention_forward<{c.template_args}>("
                     f"GlobalIn<{t}>, GlobalIn<{t}>, "
                     f"GlobalIn<{t}>, GlobalOut<{t}>, GlobalOut<float>, int, int, float, int);")
        lines.append(f'extern "C" __device__ const unsigned int hbmsim_dynamic_smem_{i} = '
                     f"FlashSmem<{c.template_args}>::bytes;")
    if softmax:
        lines.append('#include "softmax.cu"')
        for t in ("float", "fp16"):
            lines.append(f"template __global__ void softmax_rows<{t}, {SOFTMAX_THREADS}>"
                         f"(GlobalIn<{t}>, GlobalOut<{t}>, int);")
    return "\n".join(lines) + "\n"


def parse_ptxas(text: str, arch: str, dynamic_smem: dict) -> dict[str, KernelResources]:
    """ptxas -v output -> {C++ kernel name: resources}. dynamic_smem: kernel name -> bytes."""
    out, entry, frame = {}, None, (0, 0, 0)
    for line in text.splitlines():
        if m := _ENTRY.search(line):
            entry, frame = m.group(1), (0, 0, 0)
        elif (m := _FRAME.search(line)) and entry:
            frame = tuple(int(x) for x in m.groups())
        elif (m := _USED.search(line)) and entry:
            if f := _FLASH.search(entry):
                name = f"flash_attention_forward<{_type(f.group(1))}, {f.group(2)}, {f.group(3)}, {f.group(4)}>"
            elif s := _SOFTMAX.search(entry):
                name = f"softmax_rows<{_type(s.group(1))}, {s.group(2)}>"
            else:
                name = entry
            out[name] = KernelResources(name, arch, int(m.group(1)), int(m.group(3) or 0),
                                        dynamic_smem.get(name, 0), *frame)
            entry = None
    return out


def compile_kernels(configs: Iterable[KernelConfig], arch: str = "sm_80", softmax: bool = True,
                    defines: Iterable[str] = ()) -> dict[str, KernelResources]:
    """Compile the flash kernel for each configuration (and the softmax kernel) for `arch`;
    returns ptxas's resource report per kernel. Raises HbmsimError without nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise HbmsimError("compile check: nvcc not found (set NVCC or put the CUDA toolkit on the PATH)")
    ptxas = find_ptxas(nvcc)
    if ptxas is None:
        raise HbmsimError(f"compile check: ptxas not found beside {nvcc} or on the PATH")
    configs = sorted(set(configs), key=repr)
    tu = translation_unit(configs, softmax)
    flags = ["-std=c++17", f"-arch={arch}", f"-I{KERNEL_DIR}"] + [f"-D{d}" for d in defines]
    key = hashlib.sha256("\0".join([tu, " ".join(flags), nvcc, FLASH_SOURCE.read_text(), SOFTMAX_SOURCE.read_text(),
                                    (KERNEL_DIR / "portable.h").read_text()]).encode()).hexdigest()[:20]
    cached = cache_dir() / "nvcc" / f"{key}.json"
    if cached.exists():
        return {k: KernelResources(**v) for k, v in json.loads(cached.read_text()).items()}
    with tempfile.TemporaryDirectory() as tmp:
        src, ptx = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.ptx"
        src.write_text(tu)
        _run([nvcc, "-ptx", *flags, str(src), "-o", str(ptx)], "nvcc")
        ptx_text = ptx.read_text()
        listing = _run([ptxas, f"-arch={arch}", "-v", str(ptx), "-o", str(Path(tmp) / "kernels.cubin")], "ptxas")
    consts = {int(i): int(v) for i, v in _SMEM_CONST.findall(ptx_text)}
    dynamic = {c.kernel_name: consts[i] for i, c in enumerate(configs) if i in consts}
    report = parse_ptxas(listing, arch, dynamic)
    cached.parent.mkdir(parents=True, exist_ok=True)
    cached.write_text(json.dumps({k: asdict(v) for k, v in report.items()}, indent=1))
    return report


def _run(cmd: list[str], what: str) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise HbmsimError(f"compile check: {what} failed (exit {proc.returncode}): "
                          + " | ".join(proc.stderr.strip().splitlines()[:8]))
    return proc.stdout + proc.stderr
