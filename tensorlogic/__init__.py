"""tensorlogic: TensorLogic-style programs as optimized, compiled einsum graphs.

Build a graph (``EinsumGraph``), compile it once (``compile``), call the plan many times.
"""

from __future__ import annotations

from . import errors
from .backends import available_backends, get_backend, register_backend
from .compiler.compile import clear_cache, compile
from .compiler.plan import CompiledPlan
from .errors import (
    BackendError,
    DTypeError,
    GradError,
    GraphError,
    InputError,
    MemoryBudgetError,
    ProgramError,
    SerializationError,
    ShapeError,
    SpecError,
    TensorLogicError,
)
from .ir.graph import EinsumGraph, Tensor
from .options import CompileOptions

# learning: gradients as graph transformations
from .autodiff import grad, vjp

# profiler
from .errors import MissingDependencyError
from .profiler import Peaks, Profile, calibrate, profile

# the TensorLogic language (tl.parse / tl.load_program) and Datalog
from . import datalog
from .lang import Program, load_program, parse

# batched inference
from .pipeline import BatchError, BatchFailure, BatchOutput, local_cluster, run_batched, run_batches

# learning: parameters (EinsumGraph.parameter), optimizers, the training loop
from . import optim
from .learn import History, train

__version__ = "0.1.0"

__all__ = [
    "BackendError",
    "CompileOptions",
    "CompiledPlan",
    "DTypeError",
    "EinsumGraph",
    "GradError",
    "GraphError",
    "InputError",
    "MemoryBudgetError",
    "ProgramError",
    "SerializationError",
    "ShapeError",
    "SpecError",
    "Tensor",
    "TensorLogicError",
    "available_backends",
    "clear_cache",
    "compile",
    "errors",
    "get_backend",
    "register_backend",
    # learning
    "grad",
    "vjp",
    # profiler
    "MissingDependencyError",
    "Peaks",
    "Profile",
    "calibrate",
    "profile",
    # the TensorLogic language
    "Program",
    "datalog",
    "load_program",
    "parse",
    # batched inference (pipeline/)
    "BatchError",
    "BatchFailure",
    "BatchOutput",
    "local_cluster",
    "run_batched",
    "run_batches",
    # learning
    "History",
    "optim",
    "train",
]
