"""kernels/gpu.py's cuBLAS call (gemm_batched) without a GPU: a stand-in for cuBLAS's
gemmStridedBatchedEx that does what the cuBLAS documentation says (column-major, op(A) B per
batch, strides in elements) checks that standard_attention's two calls compute S = Q K^T and
O = P V of row-major (batch*heads, rows, cols) arrays. The GPU run itself is unmeasured here."""
import sys
import types

import numpy as np

from hbmsim.kernels import gpu


class DeviceArray:
    """What gemm_batched reads of a CuPy array: .dtype and .data.ptr (here: a key into MEMORY)."""
    def __init__(self, array):
        self.array, self.dtype = array, array.dtype
        self.data = types.SimpleNamespace(ptr=id(array))
        MEMORY[id(array)] = array


MEMORY: dict = {}


def fake_gemm(handle, transa, transb, m, n, k, alpha, a, atype, lda, stride_a, b, btype, ldb, stride_b,
              beta, c, ctype, ldc, stride_c, batch, compute, algo):
    A, B, C = (MEMORY[p].reshape(-1) for p in (a, b, c))
    assert transb == gpu.CUBLAS_OP_N and compute == gpu.CUBLAS_COMPUTE_32F
    for i in range(batch):
        rows_a, cols_a = (k, m) if transa == gpu.CUBLAS_OP_T else (m, k)
        ai = A[i * stride_a:i * stride_a + lda * cols_a].reshape(cols_a, lda).T[:rows_a]     # column-major view
        bi = B[i * stride_b:i * stride_b + ldb * n].reshape(n, ldb).T[:k]
        op_a = ai.T if transa == gpu.CUBLAS_OP_T else ai
        ci = op_a.astype(np.float64) @ bi.astype(np.float64)                               # (m, n)
        C[i * stride_c:i * stride_c + ldc * n] = ci.T.reshape(-1).astype(C.dtype)           # column-major, ldc = m


def test_standard_attentions_gemms_compute_qkt_and_pv(monkeypatch):
    fake_cublas = types.SimpleNamespace(gemmStridedBatchedEx=fake_gemm, setPointerMode=lambda h, m: None,
                                        CUBLAS_POINTER_MODE_HOST=0)
    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(device=types.SimpleNamespace(
        get_cublas_handle=lambda: 0), cublas=fake_cublas))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    monkeypatch.setitem(sys.modules, "cupy.cuda", fake_cupy.cuda)
    monkeypatch.setitem(sys.modules, "cupy.cuda.cublas", fake_cublas)
    rng = np.random.default_rng(0)
    g, nq, nk, d = 3, 5, 7, 4
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((g, nq, d), (g, nk, d), (g, nk, d)))
    s = np.zeros((g, nq, nk), np.float32)
    gpu.gemm_batched(DeviceArray(k), DeviceArray(q), DeviceArray(s), m=nk, n=nq, k=d, lda=d, ldb=d, transa=True,
                     batch=g)
    np.testing.assert_allclose(s, q @ k.transpose(0, 2, 1), rtol=1e-5)
    p = rng.standard_normal((g, nq, nk)).astype(np.float32)
    o = np.zeros((g, nq, d), np.float32)
    gpu.gemm_batched(DeviceArray(v), DeviceArray(p), DeviceArray(o), m=d, n=nq, k=nk, lda=d, ldb=nk, transa=False,
                     batch=g)
    np.testing.assert_allclose(o, p @ v, rtol=1e-5)
