"""The kernels on a GPU through CuPy: flash_attention (flash_attention.cu) and the standard
attention baseline that materialises S and P in global memory (two cuBLAS strided-batched GEMMs
in the storage dtype, CuPy elementwise scale and mask, and the softmax RawKernel of softmax.cu):
the kernel list of hbmsim's `standard` program (eager PyTorch), one kernel per step.

Both take CuPy arrays shaped (batch, heads, seq, head_dim), float16 or float32, and return
(O, lse) / O. Sources are compiled with NVRTC through cupy.RawModule (CuPy caches the binary).
A flash configuration whose shared memory exceeds the device's opt-in limit raises HbmsimError
before launch; above the default 48 KiB the opt-in attribute is set on the kernel.
"""
from __future__ import annotations

import math

import numpy as np

from hbmsim.simulator import HbmsimError

from .config import FLASH_SOURCE, KERNEL_DIR, SOFTMAX_SOURCE, KernelConfig, check_shapes, default_scale, dtype_name

NVRTC_OPTIONS = ("-std=c++17", f"-I{KERNEL_DIR}")
DEFAULT_SMEM_LIMIT_BYTES = 48 * 1024      # above this a kernel must opt in
ATTR_MAX_SMEM_PER_BLOCK_OPTIN = 97        # cudaDevAttrMaxSharedMemoryPerBlockOptin
SOFTMAX_THREADS = 256
_modules: dict = {}


def cupy_module():
    try:
        import cupy
    except ImportError:
        raise HbmsimError("gpu: CuPy is not installed "
                          "(pip install 'hbmsim[gpu]', or cupy-cuda12x / cupy-cuda13x)") from None
    return cupy


def gpu_available() -> tuple[bool, str]:
    """(True, device name) when CuPy can see a CUDA GPU, else (False, why not)."""
    try:
        cp = cupy_module()
    except HbmsimError as err:
        return False, str(err)
    try:
        n = cp.cuda.runtime.getDeviceCount()
    except Exception as err:          # no driver, no device: CuPy raises its own runtime error
        return False, f"no CUDA device ({type(err).__name__}: {err})"
    if n < 1:
        return False, "no CUDA device"
    name = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)["name"]
    return True, name.decode() if isinstance(name, bytes) else str(name)


def _function(source, name: str):
    cp = cupy_module()
    key = (str(source), name, cp.cuda.Device().id)
    if key not in _modules:
        module = cp.RawModule(code=source.read_text(), options=NVRTC_OPTIONS, name_expressions=[name])
        _modules[key] = module.get_function(name)
    return _modules[key]


def smem_limit_bytes() -> int:
    cp = cupy_module()
    return cp.cuda.runtime.deviceGetAttribute(ATTR_MAX_SMEM_PER_BLOCK_OPTIN, cp.cuda.Device().id)


def _prepare_kernel(source, name: str, smem_bytes: int, what: str):
    limit = smem_limit_bytes()
    if smem_bytes > limit:
        raise HbmsimError(f"{what}: a block needs {smem_bytes} bytes of shared memory, more than this GPU's "
                          f"limit {limit} (max opt-in shared memory per block)")
    kernel = _function(source, name)
    if smem_bytes > DEFAULT_SMEM_LIMIT_BYTES:
        kernel.max_dynamic_shared_size_bytes = smem_bytes    # cudaFuncAttributeMaxDynamicSharedMemorySize
    return kernel


def _inputs(q, k, v):
    cp = cupy_module()
    b, h, nq, nk, d = check_shapes(q.shape, k.shape, v.shape)
    dt = dtype_name(q.dtype)
    for name, arr in (("k", k), ("v", v)):
        if dtype_name(arr.dtype) != dt:
            raise HbmsimError(f"input {name}: dtype {arr.dtype} must equal q's {q.dtype}")
    return (b, h, nq, nk, d, dt), tuple(cp.ascontiguousarray(x) for x in (q, k, v))


def flash_attention(q, k, v, *, block_q: int, block_kv: int, causal: bool = False, scale: float | None = None):
    """Forward flash attention on the GPU. Returns (O like q, lse float32 (batch, heads, seq_q))."""
    cp = cupy_module()
    (b, h, nq, nk, d, dt), (q, k, v) = _inputs(q, k, v)
    cfg = KernelConfig(dt, block_q, block_kv, d)
    kernel = _prepare_kernel(FLASH_SOURCE, cfg.kernel_name, cfg.smem_bytes, f"kernel {cfg.label()}")
    o = cp.empty_like(q)
    lse = cp.empty((b, h, nq), dtype=cp.float32)
    grid = (math.ceil(nq / block_q), b * h)
    kernel(grid, (block_q,), (q, k, v, o, lse, np.int32(nq), np.int32(nk), np.float32(default_scale(d, scale)),
                              np.int32(bool(causal))), shared_mem=cfg.smem_bytes)
    return o, lse


def causal_mask(seq_len_q: int, seq_len_kv: int):
    """The (Nq, Nkv) bool mask eager PyTorch reads: True where query i may see key j
    (bottom-right aligned, j <= i + Nkv - Nq)."""
    cp = cupy_module()
    i = cp.arange(seq_len_q)[:, None]
    j = cp.arange(seq_len_kv)[None, :]
    return j <= i + (seq_len_kv - seq_len_q)


def standard_attention(q, k, v, *, causal: bool = False, scale: float | None = None, mask=None):
    """Standard attention as eager PyTorch runs it, each step its own kernel through global
    memory: S = Q K^T (a cuBLAS batched GEMM in the storage dtype), S *= scale, S = where(mask, S,
    -inf), P = softmax(S) (RawKernel), O = P V (GEMM). S and P are (batch, heads, Nq, Nkv) in the
    storage dtype.
    `mask` may be passed precomputed (causal_mask) so that it is not built inside a timing."""
    cp = cupy_module()
    (b, h, nq, nk, d, dt), (q, k, v) = _inputs(q, k, v)
    smem = nk * 4                                    # the softmax kernel's row buffer (fp32)
    kernel = _prepare_kernel(SOFTMAX_SOURCE, f"softmax_rows<{'fp16' if dt == 'fp16' else 'float'}, {SOFTMAX_THREADS}>",
                             smem, f"softmax over {nk} keys")
    s = cp.empty((b, h, nq, nk), dtype=q.dtype)
    gemm_batched(k, q, s, m=nk, n=nq, k=d, lda=d, ldb=d, transa=True, batch=b * h)       # S^T = K Q^T, column-major
    s *= s.dtype.type(default_scale(d, scale))
    if causal:
        ok = causal_mask(nq, nk) if mask is None else mask
        _mask_kernel()(ok, s)
    p = cp.empty_like(s)
    kernel((b * h * nq,), (SOFTMAX_THREADS,), (s, p, np.int32(nk)), shared_mem=smem)
    o = cp.empty_like(q)
    gemm_batched(v, p, o, m=d, n=nq, k=nk, lda=d, ldb=nk, transa=False, batch=b * h)     # O^T = V^T P^T
    return o


# cuBLAS enum values (cublas_api.h, library_types.h; CUDA 11+): data types, the compute type and
# the default algorithm (tensor cores wherever the types allow: cuBLAS docs, cublasGemmEx).
CUDA_R_32F, CUDA_R_16F = 0, 2
CUBLAS_COMPUTE_32F = 68
CUBLAS_GEMM_DEFAULT = -1
CUBLAS_OP_N, CUBLAS_OP_T = 0, 1


def gemm_batched(a, b, c, *, m: int, n: int, k: int, lda: int, ldb: int, transa: bool, batch: int) -> None:
    """C_i = op(A_i) B_i for each of `batch` contiguous matrices, column-major (cuBLAS's view of
    row-major arrays: a row-major X is the column-major X^T), in the arrays' storage dtype with
    fp32 accumulation: cublasGemmStridedBatchedEx, one kernel, inputs and output in fp16 (or fp32)
    as eager PyTorch's bmm runs them. (CuPy's matmul on fp16 4-D arrays upcasts both operands to
    fp32 copies and runs a SIMT sgemm: the kernels the shipped h100-profile-demo.json measured.)
    GPU-only: written against the cuBLAS API, not run by this project's tests without a GPU."""
    cp = cupy_module()
    from cupy.cuda import cublas
    dtype = CUDA_R_16F if a.dtype == np.float16 else CUDA_R_32F
    one, zero = np.array(1.0, dtype=np.float32), np.array(0.0, dtype=np.float32)   # fp32 compute: fp32 scalars
    handle = cp.cuda.device.get_cublas_handle()
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.gemmStridedBatchedEx(
        handle, CUBLAS_OP_T if transa else CUBLAS_OP_N, CUBLAS_OP_N, m, n, k,
        one.ctypes.data, a.data.ptr, dtype, lda, m * k, b.data.ptr, dtype, ldb, k * n,
        zero.ctypes.data, c.data.ptr, dtype, m, m * n, batch, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT)


def _mask_kernel():
    cp = cupy_module()
    if "mask" not in _modules:       # in place: reads the bool mask and S, writes S
        _modules["mask"] = cp.ElementwiseKernel("bool ok", "T s", "if (!ok) s = (T)(-__int_as_float(0x7f800000))",
                                                "hbmsim_causal_mask")
    return _modules["mask"]
