"""The CPU emulation of flash_attention.cu: build it with g++ (cached), run it on numpy arrays.

g++ compiles the kernel source unchanged, with cuda_emulation.h standing in for CUDA (one OS
thread per CUDA thread, blocks one at a time, __syncthreads as a barrier) and counting,
bounds-checked proxies for global memory. The result carries the bytes the kernel's own loads
and stores moved, per tensor. These are emulated, not measured on a GPU.

Builds are cached under $HBMSIM_CACHE (default ~/.cache/hbmsim)/emulation/<hash>, the hash
covering the kernel sources, the generated translation unit and the compiler flags, so each
configuration set compiles once per machine.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

import numpy as np

from hbmsim.simulator import HbmsimError

from .config import DTYPES, FLASH_SOURCE, KERNEL_DIR, KernelConfig, check_shapes, default_scale, dtype_name

SOURCES = (FLASH_SOURCE, KERNEL_DIR / "cuda_emulation.h", KERNEL_DIR / "emulation_entry.h")
TENSORS = ("Q", "K", "V", "O", "lse")
# H100's largest opt-in shared memory per block (227 KiB): the emulation refuses more, as a GPU would.
MAX_SMEM_BYTES = 232_448
BASE_FLAGS = ("-std=c++17", "-pthread", "-Wall", "-Wno-unknown-pragmas", "-DHBMSIM_EMULATION")
LIBRARY_FLAGS = ("-O2", "-shared", "-fPIC")
TSAN_FLAGS = ("-O1", "-g", "-fsanitize=thread", "-DHBMSIM_EMULATION_MAIN")


class EmulationError(HbmsimError):
    """The emulated kernel failed: an out-of-bounds access, or a build without the instantiation."""


class EmuFlashArgs(ctypes.Structure):
    """Mirrors struct EmuFlashArgs in emulation_entry.h."""
    _fields_ = [(name, ctypes.c_int) for name in ("dtype", "block_q", "block_kv", "head_dim", "batch", "heads",
                                                  "seq_len_q", "seq_len_kv", "causal")] + [
        ("scale", ctypes.c_float),
        ("q", ctypes.c_void_p), ("k", ctypes.c_void_p), ("v", ctypes.c_void_p), ("o", ctypes.c_void_p),
        ("lse", ctypes.c_void_p),
        ("elems", ctypes.c_longlong * 5),
        ("read_bytes", ctypes.c_ulonglong * 5),
        ("write_bytes", ctypes.c_ulonglong * 5),
        ("error", ctypes.c_char * 512),
    ]


@dataclass
class EmulatedRun:
    o: np.ndarray                  # (batch, heads, seq_len_q, head_dim), storage dtype
    lse: np.ndarray                # (batch, heads, seq_len_q), fp32
    traffic: dict                  # tensor name -> (read_bytes, write_bytes), counted by the proxies
    smem_bytes: int                # dynamic shared memory the launch gave each block


def cache_dir() -> Path:
    return Path(os.environ.get("HBMSIM_CACHE") or Path.home() / ".cache" / "hbmsim")


def compiler() -> str:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not cxx:
        raise HbmsimError("emulation: no C++ compiler found (set CXX, or install g++)")
    return cxx


def translation_unit(configs: Iterable[KernelConfig]) -> str:
    lines = ['#include "emulation_entry.h"', "HBMSIM_DISPATCH_BEGIN"]
    lines += [f"HBMSIM_FLASH_CASE({c.template_args})" for c in sorted(set(configs), key=repr)]
    lines.append("HBMSIM_DISPATCH_END")
    return "\n".join(lines) + "\n"


def build(configs: Iterable[KernelConfig], *, tsan: bool = False, defines: Iterable[str] = ()) -> Path:
    """Compile the emulation for these configurations: a shared library, or with tsan=True a
    ThreadSanitizer executable (see emulation_entry.h's main). Returns the cached path."""
    configs = list(configs)
    if not configs:
        raise HbmsimError("emulation: needs at least one kernel configuration to build")
    tu = translation_unit(configs)
    flags = BASE_FLAGS + (TSAN_FLAGS if tsan else LIBRARY_FLAGS) + tuple(f"-D{d}" for d in defines)
    cxx = compiler()
    key = hashlib.sha256()
    for part in [tu, " ".join(flags), cxx] + [p.read_text() for p in SOURCES]:
        key.update(part.encode() + b"\0")
    out_dir = cache_dir() / "emulation" / key.hexdigest()[:20]
    target = out_dir / ("flash_tsan" if tsan else "libflash_emulation.so")
    if target.exists():
        return target
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "flash_emulation.cpp").write_text(tu)
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        partial = Path(tmp) / target.name
        cmd = [cxx, *flags, f"-I{KERNEL_DIR}", str(out_dir / "flash_emulation.cpp"), "-o", str(partial)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise HbmsimError(f"emulation: {Path(cxx).name} failed (exit {proc.returncode}): "
                              + " | ".join(proc.stderr.strip().splitlines()[:8]))
        os.replace(partial, target)     # atomic: a concurrent build never sees half a file
    return target


class Emulator:
    """One emulation build covering a set of kernel configurations."""

    _lock = threading.Lock()         # the emulation runtime has one global block at a time

    def __init__(self, configs: Iterable[KernelConfig], defines: Iterable[str] = ()):
        self.configs = frozenset(configs)
        self.path = build(self.configs, defines=defines)
        self._lib = ctypes.CDLL(str(self.path))
        self._lib.hbmsim_flash_forward.argtypes = [ctypes.POINTER(EmuFlashArgs), ctypes.c_int]
        self._lib.hbmsim_flash_forward.restype = ctypes.c_int
        self._lib.hbmsim_swizzle_index.argtypes = [ctypes.c_int] * 4
        self._lib.hbmsim_swizzle_index.restype = ctypes.c_int
        self._lib.hbmsim_float_to_half.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]

    def smem_bytes(self, cfg: KernelConfig) -> int:
        """The kernel's own FlashSmem<...>::bytes for this instantiation (from the C++ source)."""
        args = EmuFlashArgs(dtype=cfg.dtype_code, block_q=cfg.block_q, block_kv=cfg.block_kv, head_dim=cfg.head_dim)
        n = self._lib.hbmsim_flash_forward(ctypes.byref(args), 1)
        if n < 0:
            raise EmulationError(f"emulation: {args.error.decode()}")
        return n

    def swizzle_index(self, dtype: str, head_dim: int, row: int, col: int) -> int:
        return self._lib.hbmsim_swizzle_index(DTYPES[dtype][2], head_dim, row, col)

    def float_to_half(self, x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.shape, dtype=np.uint16)
        self._lib.hbmsim_float_to_half(x.ctypes.data, out.ctypes.data, x.size)
        return out.view(np.float16)

    def flash_attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int, block_kv: int,
                        causal: bool = False, scale: float | None = None,
                        buffer_elems: dict | None = None) -> EmulatedRun:
        """Run the emulated kernel on (batch, heads, seq, head_dim) arrays of one storage dtype.

        buffer_elems overrides the extent the bounds checks allow per tensor (tests use it to
        show that an access past a buffer's end is caught)."""
        b, h, nq, nk, d = check_shapes(q.shape, k.shape, v.shape)
        dt = dtype_name(q.dtype)
        for name, arr in (("k", k), ("v", v)):
            if dtype_name(arr.dtype) != dt:
                raise HbmsimError(f"input {name}: dtype {arr.dtype} must equal q's {q.dtype}")
        cfg = KernelConfig(dt, block_q, block_kv, d)
        if cfg not in self.configs:
            raise EmulationError(f"emulation: this build has no instantiation {cfg.label()} "
                                 f"(built for {', '.join(sorted(c.label() for c in self.configs))})")
        if cfg.smem_bytes > MAX_SMEM_BYTES:
            raise HbmsimError(f"kernel {cfg.label()}: a block needs {cfg.smem_bytes} bytes of shared memory, "
                              f"more than the emulation's limit {MAX_SMEM_BYTES} (H100's opt-in maximum)")
        q, k, v = (np.ascontiguousarray(x) for x in (q, k, v))
        o = np.empty_like(q)
        lse = np.empty((b, h, nq), dtype=np.float32)
        args = EmuFlashArgs(dtype=cfg.dtype_code, block_q=block_q, block_kv=block_kv, head_dim=d, batch=b, heads=h,
                            seq_len_q=nq, seq_len_kv=nk, causal=int(bool(causal)),
                            scale=default_scale(d, scale), q=q.ctypes.data, k=k.ctypes.data, v=v.ctypes.data,
                            o=o.ctypes.data, lse=lse.ctypes.data)
        sizes = {"Q": q.size, "K": k.size, "V": v.size, "O": o.size, "lse": lse.size}
        for i, name in enumerate(TENSORS):
            n = (buffer_elems or {}).get(name, sizes[name])
            if not 0 <= n <= sizes[name]:
                raise HbmsimError(f"emulation: buffer_elems[{name!r}] = {n} must lie in 0..{sizes[name]}")
            args.elems[i] = n
        with self._lock:
            rc = self._lib.hbmsim_flash_forward(ctypes.byref(args), 0)
        if rc != 0:
            raise EmulationError(f"emulated kernel {cfg.label()}: {args.error.decode()}")
        traffic = {name: (args.read_bytes[i], args.write_bytes[i]) for i, name in enumerate(TENSORS)}
        return EmulatedRun(o, lse, traffic, self.smem_bytes(cfg))      # the kernel's own FlashSmem value


_emulators: dict = {}


def emulator(configs: Iterable[KernelConfig]) -> Emulator:
    """A shared Emulator for this set of configurations (built once per process)."""
    key = frozenset(configs)
    if key not in _emulators:
        _emulators[key] = Emulator(key)
    return _emulators[key]


def emulate_flash_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, *, block_q: int, block_kv: int,
                            causal: bool = False, scale: float | None = None) -> EmulatedRun:
    """flash_attention on the CPU emulation: numpy in, numpy out, plus the counted bytes."""
    d = check_shapes(q.shape, k.shape, v.shape)[4]
    cfg = KernelConfig(dtype_name(q.dtype), block_q, block_kv, d)
    return emulator([cfg]).flash_attention(q, k, v, block_q=block_q, block_kv=block_kv, causal=causal, scale=scale)


def run_tsan(cfg: KernelConfig, batch: int, heads: int, seq_len_q: int, seq_len_kv: int, causal: bool,
             defines: Iterable[str] = ()) -> subprocess.CompletedProcess:
    """Build the ThreadSanitizer executable for cfg and run one case; TSan reports races on
    stderr and exits 66 when it found any."""
    exe = build([cfg], tsan=True, defines=defines)
    cmd = [str(exe), cfg.dtype, str(cfg.block_q), str(cfg.block_kv), str(cfg.head_dim), str(batch), str(heads),
           str(seq_len_q), str(seq_len_kv), str(int(causal))]
    env = dict(os.environ, TSAN_OPTIONS="halt_on_error=0 exitcode=66 history_size=4")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
