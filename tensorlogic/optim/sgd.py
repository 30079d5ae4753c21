"""Stochastic gradient descent with momentum, dampening, Nesterov and weight decay (PyTorch's
``torch.optim.SGD`` update)."""

from __future__ import annotations

from typing import Any

from ..errors import InputError
from .base import Optimizer, check_number
from .kernels import Program, scalar, update_kernel


class SGD(Optimizer):
    """``p -= lr * d`` with ``d = g + weight_decay * p``; with ``momentum`` the buffer
    ``b = momentum * b + (1 - dampening) * d`` (``b = d`` on the first step) replaces ``d``, or
    with ``nesterov=True`` ``d + momentum * b`` does.

    Each step runs one fused in-place kernel per parameter (two with momentum: the buffer, then
    the parameter); the learning rate may be changed between steps (``opt.lr = ...``).
    """

    def __init__(
        self,
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        super().__init__(lr, weight_decay)
        self.momentum = check_number("momentum", momentum)
        self.dampening = check_number("dampening", dampening, high=1.0)
        if not isinstance(nesterov, bool):
            raise InputError(f"nesterov must be True or False, got {nesterov!r}")
        if nesterov and (self.momentum == 0 or self.dampening != 0):
            raise InputError("nesterov=True needs momentum > 0 and dampening = 0")
        self.nesterov = nesterov
        self.state_names = ("momentum_buffer",) if self.momentum else ()

    def hyperparameters(self) -> dict[str, Any]:  # noqa: D102
        return {
            **super().hyperparameters(),
            "momentum": self.momentum,
            "dampening": self.dampening,
            "nesterov": self.nesterov,
        }

    def _update(self, p, g, state, backend, fresh) -> None:  # noqa: D102
        shape, dtype = tuple(p.shape), p.dtype.name
        wd, mom = self.weight_decay, self.momentum
        lr = scalar(backend, self.lr, dtype)
        if not mom:
            k = update_kernel(("sgd", wd), lambda: _plain(wd), shape, dtype, 3, (2,), backend)
            k.run(p, g, lr)
            return
        buf = state["momentum_buffer"]
        first = fresh  # torch: the buffer starts as the first gradient, undamped
        cb = scalar(backend, 0.0 if first else mom, dtype)
        cg = scalar(backend, 1.0 if first else 1.0 - self.dampening, dtype)
        kb = update_kernel(("sgd_buf", wd), lambda: _buffer(wd), shape, dtype, 5, (3, 4), backend)
        kb.run(buf, g, p, cb, cg)
        kp = update_kernel(
            ("sgd_mom", wd, mom, self.nesterov),
            lambda: _momentum(wd, mom, self.nesterov),
            shape,
            dtype,
            4,
            (3,),
            backend,
        )
        kp.run(p, g, buf, lr)


def _decayed(pr: Program, g, p, wd: float):
    """``g + wd * p`` (just ``g`` without weight decay)."""
    return pr.op("add", g, pr.op("mul", p, wd)) if wd else g


def _plain(wd: float) -> Program:
    # inputs: p, g, lr
    pr = Program()
    p, g, lr = pr.input(0), pr.input(1), pr.input(2)
    d = _decayed(pr, g, p, wd)
    pr.op("sub", p, pr.op("mul", lr, d))
    return pr


def _buffer(wd: float) -> Program:
    # inputs: buf, g, p, cb, cg  ->  cb * buf + cg * d
    pr = Program()
    buf, g, p, cb, cg = (pr.input(k) for k in range(5))
    d = _decayed(pr, g, p, wd)
    pr.op("add", pr.op("mul", buf, cb), pr.op("mul", d, cg))
    return pr


def _momentum(wd: float, mom: float, nesterov: bool) -> Program:
    # inputs: p, g, buf (already updated), lr
    pr = Program()
    p, g, buf, lr = (pr.input(k) for k in range(4))
    d = pr.op("add", _decayed(pr, g, p, wd), pr.op("mul", buf, mom)) if nesterov else buf
    pr.op("sub", p, pr.op("mul", lr, d))
    return pr


__all__ = ["SGD"]
