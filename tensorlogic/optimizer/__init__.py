"""Graph optimizer: passes and the pass manager."""

from .base import OptimizerReport, Pass, PassManager, PassResult, optimize, register_pass

__all__ = ["OptimizerReport", "Pass", "PassManager", "PassResult", "optimize", "register_pass"]
