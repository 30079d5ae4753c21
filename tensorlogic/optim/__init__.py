"""Optimizers that update a plan's parameters in place with fused elementwise kernels.

``opt.step(plan, grads)`` after ``grads = plan(...)`` (the ``grad_<name>`` outputs of a graph
made by ``tl.grad``); ``opt.state_dict()`` / ``opt.load_state_dict(state, plan)`` for
checkpoints. ``tl.train`` runs the loop.
"""

from __future__ import annotations

from .adam import Adam, AdamW
from .base import Optimizer
from .sgd import SGD

__all__ = ["Adam", "AdamW", "Optimizer", "SGD"]
