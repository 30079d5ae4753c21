"""Adam and AdamW (PyTorch's ``torch.optim.Adam`` / ``AdamW`` updates, without amsgrad)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ..errors import InputError
from .base import Optimizer, check_number
from .kernels import Program, scalar, update_kernel


class Adam(Optimizer):
    """Adam: ``m += (1 - b1) (g - m)``, ``v = b2 v + (1 - b2) g^2``, then
    ``p -= lr / (1 - b1^t) * m / (sqrt(v) / sqrt(1 - b2^t) + eps)``.

    ``weight_decay`` adds ``weight_decay * p`` to the gradient (L2, as ``torch.optim.Adam``);
    with ``decoupled=True`` (AdamW, as ``torch.optim.AdamW``) the parameter is instead scaled by
    ``1 - lr * weight_decay`` before the update. On the host backends each parameter is updated
    in one pass over memory (``backends/host_adam.py``); elsewhere each step runs three fused
    in-place kernels per parameter (first moment, second moment, parameter).
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        decoupled: bool = False,
    ) -> None:
        super().__init__(lr, weight_decay)
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise InputError(f"betas must be a pair (beta1, beta2), got {betas!r}")
        self.betas = (
            check_number("betas[0]", betas[0], high=1.0, high_open=True),
            check_number("betas[1]", betas[1], high=1.0, high_open=True),
        )
        self.eps = check_number("eps", eps)
        if not isinstance(decoupled, bool):
            raise InputError(f"decoupled must be True or False, got {decoupled!r}")
        self.decoupled = decoupled

    def hyperparameters(self) -> dict[str, Any]:  # noqa: D102
        return {
            **super().hyperparameters(),
            "betas": list(self.betas),
            "eps": self.eps,
            "decoupled": self.decoupled,
        }

    def _update(self, p, g, state, backend, fresh) -> None:  # noqa: D102
        shape, dtype = tuple(p.shape), p.dtype.name
        b1, b2 = self.betas
        l2 = 0.0 if self.decoupled else self.weight_decay
        t = self.steps
        m, v = state["exp_avg"], state["exp_avg_sq"]
        decay = self.decoupled and self.weight_decay != 0
        step_size = self.lr / (1 - b1**t)
        one_pass = getattr(backend, "adam_one_pass", None)  # the CPU backends have one
        fn = one_pass((p, g, m, v)) if one_pass is not None else None
        if fn is not None:
            dec = 1 - self.lr * self.weight_decay if decay else 1.0
            c = np.array(
                [1 - b1, b2, 1 - b2, l2, dec, step_size, math.sqrt(1 - b2**t), self.eps], p.dtype
            )
            fn(p.reshape(-1), g.reshape(-1), m.reshape(-1), v.reshape(-1), c)
            return
        km = update_kernel(("adam_m", b1, l2), lambda: _first(b1, l2), shape, dtype, 3, (), backend)
        km.run(m, g, p)
        kv = update_kernel(
            ("adam_v", b2, l2), lambda: _second(b2, l2), shape, dtype, 3, (), backend
        )
        kv.run(v, g, p)
        kp = update_kernel(
            ("adam_p", self.eps, decay),
            lambda: _param(self.eps, decay),
            shape,
            dtype,
            6,
            (3, 4, 5),
            backend,
        )
        kp.run(
            p,
            m,
            v,
            scalar(backend, step_size, dtype),
            scalar(backend, math.sqrt(1 - b2**t), dtype),
            scalar(backend, 1 - self.lr * self.weight_decay if decay else 1.0, dtype),
        )


class AdamW(Adam):
    """Adam with decoupled weight decay (``torch.optim.AdamW``; default weight_decay 0.01)."""

    def __init__(
        self,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
    ) -> None:
        super().__init__(lr, betas, eps, weight_decay, decoupled=True)


def _grad(pr: Program, g, p, l2: float):
    return pr.op("add", g, pr.op("mul", p, l2)) if l2 else g


def _first(b1: float, l2: float) -> Program:
    # inputs: m, g, p  ->  m + (1 - b1) * (d - m)   (torch's lerp)
    pr = Program()
    m, g, p = pr.input(0), pr.input(1), pr.input(2)
    d = _grad(pr, g, p, l2)
    pr.op("add", m, pr.op("mul", pr.op("sub", d, m), 1.0 - b1))
    return pr


def _second(b2: float, l2: float) -> Program:
    # inputs: v, g, p  ->  v * b2 + (1 - b2) * d * d
    pr = Program()
    v, g, p = pr.input(0), pr.input(1), pr.input(2)
    d = _grad(pr, g, p, l2)
    pr.op("add", pr.op("mul", v, b2), pr.op("mul", pr.op("mul", d, d), 1.0 - b2))
    return pr


def _param(eps: float, decay: bool) -> Program:
    # inputs: p, m, v, step_size, sqrt(bias correction 2), decay factor
    pr = Program()
    p, m, v, step, bc2, dec = (pr.input(k) for k in range(6))
    denom = pr.op("add", pr.op("div", pr.op("sqrt", v), bc2), eps)
    base = pr.op("mul", p, dec) if decay else p
    pr.op("sub", base, pr.op("mul", step, pr.op("div", m, denom)))
    return pr


__all__ = ["Adam", "AdamW"]
