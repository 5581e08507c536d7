"""ThreadSanitizer over the emulation: the kernel as shipped has no data race, and deleting one
__syncthreads (-DHBMSIM_OMIT_KV_BARRIER) is reported as a data race on the shared K/V tile."""
import re

import pytest

from hbmsim.algorithms.io_formulas import flash2_forward_io
from hbmsim.algorithms.workload import Workload
from hbmsim.kernels.config import KernelConfig
from hbmsim.kernels.emulation import run_tsan
from hbmsim.simulator import HbmsimError

CFG = KernelConfig("fp16", 16, 16, 32)
CASE = dict(batch=1, heads=2, seq_len_q=37, seq_len_kv=45, causal=True)   # 3 query blocks, ragged


def tsan_run(defines=()):
    try:
        return run_tsan(CFG, **CASE, defines=defines)
    except HbmsimError as err:        # no g++, or no libtsan on this machine
        pytest.skip(f"ThreadSanitizer build unavailable: {err}")


def test_kernel_is_race_free_under_tsan():
    proc = tsan_run()
    assert "ThreadSanitizer" not in proc.stderr, proc.stderr[:3000]
    assert proc.returncode == 0, proc.stderr[-2000:]
    counts = dict(zip(("Q", "K", "V", "O", "lse"), map(int, re.findall(r"\d+", proc.stdout))))
    io = flash2_forward_io(Workload(CASE["batch"], CASE["heads"], CASE["seq_len_q"], CASE["seq_len_kv"], CFG.head_dim,
                                    dtype=CFG.dtype, causal=True), CFG.block_q, CFG.block_kv)
    assert counts == {"Q": io["Q"][0], "K": io["K"][0], "V": io["V"][0], "O": io["O"][1], "lse": io["lse"][1]}


def test_tsan_catches_a_missing_syncthreads():
    proc = tsan_run(defines=["HBMSIM_OMIT_KV_BARRIER"])
    assert proc.returncode == 66, (proc.returncode, proc.stderr[-2000:])
    assert "WARNING: ThreadSanitizer: data race" in proc.stderr
    assert "flash_attention.cu" in proc.stderr       # the race is located in the kernel source
