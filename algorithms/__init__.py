"""Attention as programs on the simulator: the float64 reference, standard / flash1 / flash2,
and the closed-form IO formulas their counters must equal. Importing the package registers the
programs (algorithms/registry.py): each *_spec module composes its program's passes and
registers its AlgorithmSpec, in this order."""
from . import standard_spec  # noqa: F401
from . import flash1_spec  # noqa: F401
from . import flash2_spec  # noqa: F401
from . import flash3_spec  # noqa: F401
from .registry import AlgorithmSpec, algorithm_variants, algorithms, get, mapping_fields, register, unregister  # noqa: F401
