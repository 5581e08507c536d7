"""The machine: hardware spec, SimPy model of HBM / L2 / SRAM / compute, block scheduler,
traffic counters and results. Knows nothing about attention."""
from .errors import HbmsimError
from .hardware import GPU, gpu_from_dict, load_gpu
from .machine import Machine, check_program, program_footprint_bytes, simulate
from .program import BlockContext, Launch, Program, slice_shared
from .results import KernelResult, SimResult, TensorTraffic
from .tensor import DTYPE_BYTES, Tensor, TensorView
from .time_model import BASELINE, TimeModel

__all__ = ["HbmsimError", "GPU", "gpu_from_dict", "load_gpu", "BlockContext", "Launch", "slice_shared", "Machine",
           "Program", "check_program", "program_footprint_bytes", "simulate", "KernelResult", "SimResult",
           "TensorTraffic", "DTYPE_BYTES",
           "Tensor", "TensorView", "TimeModel", "BASELINE"]
