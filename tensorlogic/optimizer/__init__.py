"""Graph optimizer: passes and the pass manager.

Pipelines (each repeated to a fixpoint): O0 runs nothing; O1 runs dce, cse, fold, simplify;
O2 and O3 add layernorm (hand-written layer normalization to one row op), attention (written-out
attention to one attention node), merge (einsum merging, scalar pulling), product_sum
(einsums without data reuse to elementwise products and a sum), attention_layout (the memory
layout of attention operands, where the backend reads strided ones), contraction (path
planning) and fusion.
"""

from .base import (
    PIPELINES,
    OptimizerReport,
    Pass,
    PassManager,
    PassResult,
    optimize,
    register_pass,
)

# importing the pass modules registers them (their order is PIPELINES')
from .dce import dce
from .cse import cse
from .fold import fold
from .simplify import simplify
from .layernorm import layernorm
from .attention import attention  # before merge and fusion, which would split the pattern
from .merge import merge
from .product_sum import product_sum  # after merge, which builds these einsums
from .attention_layout import attention_layout  # after merge: the einsums around it are final
from .contraction import contraction
from .fusion import fusion, is_legal_group

__all__ = [
    "PIPELINES",
    "OptimizerReport",
    "Pass",
    "PassManager",
    "PassResult",
    "attention",
    "attention_layout",
    "contraction",
    "cse",
    "dce",
    "fold",
    "fusion",
    "is_legal_group",
    "layernorm",
    "merge",
    "optimize",
    "product_sum",
    "register_pass",
    "simplify",
]
