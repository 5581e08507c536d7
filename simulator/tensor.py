"""Tensors in global memory: a name, a shape (groups, rows, cols), a storage dtype, and data.

A group is one independent matrix (for attention: one batch-head). Programs address a tile as
`tensor[group]` plus row and column slices. `data` is float64 numpy for exact numerics, or
None in count-only mode: counts and times are the same either way.
"""
from __future__ import annotations

import itertools

import numpy as np

from .errors import HbmsimError

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4, "int32": 4, "bool": 1}
_ids = itertools.count()


class Tensor:
    __slots__ = ("name", "shape", "dtype", "itemsize", "data", "uid", "_views")

    def __init__(self, name: str, shape: tuple, dtype: str, data: np.ndarray | None = None, count_only: bool = False):
        if dtype not in DTYPE_BYTES:
            raise HbmsimError(f"tensor {name}: dtype '{dtype}' unknown (known: {', '.join(DTYPE_BYTES)})")
        shape = tuple(int(s) for s in shape)
        if len(shape) != 3 or min(shape) < 1:
            raise HbmsimError(f"tensor {name}: shape {shape} must be (groups, rows, cols), each >= 1")
        if data is not None:
            data = np.asarray(data, dtype=np.float64)
            if data.shape != shape:
                raise HbmsimError(f"tensor {name}: data shape {data.shape} disagrees with shape {shape}")
        elif not count_only:
            data = np.zeros(shape)
        self.name, self.shape, self.dtype = name, shape, dtype
        self.itemsize = DTYPE_BYTES[dtype]
        self.data = data
        self.uid = next(_ids)
        self._views = None

    @property
    def nbytes(self) -> int:
        g, r, c = self.shape
        return g * r * c * self.itemsize

    def __getitem__(self, group: int) -> "TensorView":
        if self._views is None:          # made once: programs index views in their hot loops
            self._views = [TensorView(self, g) for g in range(self.shape[0])]
        return self._views[group]

    def __repr__(self) -> str:
        return f"Tensor({self.name}, {self.shape}, {self.dtype})"


class TensorView:
    """One group of a tensor: what `ctx.load` / `ctx.store` address."""

    __slots__ = ("tensor", "group")

    def __init__(self, tensor: Tensor, group: int):
        self.tensor, self.group = tensor, group
