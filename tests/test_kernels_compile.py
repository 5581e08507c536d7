"""The CUDA source compiles with nvcc for sm_80 and sm_90 (no GPU needed), ptxas's report is
parsed, and the flash kernel's shared memory equals the shared-memory part of what the
simulator's flash2 program charges for the same block sizes and dtype."""
import pytest

from hbmsim.algorithms import flash2
from hbmsim.algorithms.workload import Workload
from hbmsim.kernels.compile_check import compile_kernels, find_nvcc, find_ptxas, parse_ptxas
from hbmsim.kernels.config import KernelConfig

CONFIGS = [KernelConfig("fp16", 64, 64, 64), KernelConfig("fp32", 64, 32, 64), KernelConfig("fp16", 128, 64, 128)]
NVCC = find_nvcc()
needs_nvcc = pytest.mark.skipif(NVCC is None or find_ptxas(NVCC) is None,
                                reason="nvcc or ptxas not found (CUDA toolkit not installed)")


@pytest.fixture(scope="module", params=["sm_80", "sm_90"])
def report(request):
    return request.param, compile_kernels(CONFIGS, request.param)


@needs_nvcc
def test_kernels_compile_and_report_resources(report):
    arch, kernels = report
    names = {c.kernel_name for c in CONFIGS} | {"softmax_rows<float, 256>", "softmax_rows<fp16, 256>"}
    assert names <= set(kernels)
    for k in kernels.values():
        assert k.arch == arch and 0 < k.registers <= 255
        assert k.stack_bytes >= 0 and k.spill_store_bytes >= 0 and k.spill_load_bytes >= 0


@needs_nvcc
def test_flash_shared_memory_equals_the_simulators(report):
    # the simulator charges Q_i, K_j and V_j in shared memory (the rest in registers); so does the kernel
    _, kernels = report
    for cfg in CONFIGS:
        k = kernels[cfg.kernel_name]
        wl = Workload(1, 1, 256, 256, cfg.head_dim, dtype=cfg.dtype)
        assert k.static_smem_bytes == 0                   # no hidden shared arrays
        assert k.smem_bytes == cfg.smem_bytes == flash2.flash2_sram_bytes(wl, cfg.block_q, cfg.block_kv)


LISTING = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z23flash_attention_forwardI4fp16Li64ELi64ELi64EEvPKT_S3_S3_PS1_Pfiifi' for 'sm_80'
ptxas info    : Function properties for _Z23flash_attention_forwardI4fp16Li64ELi64ELi64EEvPKT_S3_S3_PS1_Pfiifi
    0 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 128 registers, used 1 barriers, 408 bytes cmem[0]
ptxas info    : Compiling entry function '_Z12softmax_rowsIfLi256EEvPKT_PS0_i' for 'sm_80'
ptxas info    : Function properties for _Z12softmax_rowsIfLi256EEvPKT_PS0_i
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 1024 bytes smem, 364 bytes cmem[0]
"""


def test_parse_ptxas_listing():
    got = parse_ptxas(LISTING, "sm_80", {"flash_attention_forward<fp16, 64, 64, 64>": 24576})
    f = got["flash_attention_forward<fp16, 64, 64, 64>"]
    assert (f.registers, f.static_smem_bytes, f.dynamic_smem_bytes, f.spill_store_bytes, f.spill_load_bytes) == \
        (128, 0, 24576, 8, 4)
    s = got["softmax_rows<float, 256>"]
    assert (s.registers, s.static_smem_bytes, s.smem_bytes) == (32, 1024, 1024)
