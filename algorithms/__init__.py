"""Attention as programs on the simulator: the float64 reference, standard / flash1 / flash2,
and the closed-form IO formulas their counters must equal. Importing the package registers the
programs (algorithms/registry.py)."""
from . import standard  # noqa: F401  (each program module registers its AlgorithmSpec, in this order)
from . import flash1  # noqa: F401
from . import flash2  # noqa: F401
from .registry import AlgorithmSpec, algorithms, get, mapping_fields, register, unregister  # noqa: F401
