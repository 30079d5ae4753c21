"""VJP of einsum: the right letters for repeated indices (diagonals), ellipsis, broadcasting,
indices summed away, implicit outputs, scalars, many indices and the interleaved form."""

from __future__ import annotations

import numpy as np
import opt_einsum
import pytest

import tensorlogic as tl
from tensorlogic.testing import assert_grads_agree

CPU = ("numpy", "numba")

CASES = [
    # spec, operand shapes
    ("ij,jk->ik", [(2, 3), (3, 4)]),
    ("ii->i", [(3, 3)]),  # diagonal
    ("ii->", [(3, 3)]),  # trace
    ("iij,j->i", [(3, 3, 2), (2,)]),  # repeated index next to another
    ("iji,j->ij", [(3, 2, 3), (2,)]),
    ("ij->", [(2, 3)]),  # everything summed away
    ("ij,k->i", [(2, 3), (4,)]),  # k only in one operand, summed
    ("ij,ij->ij", [(1, 3), (2, 3)]),  # size-1 broadcast along i
    ("...ij,...jk->...ik", [(2, 1, 2, 3), (4, 3, 2)]),  # ellipsis with broadcasting
    ("ij,jk", [(2, 3), (3, 4)]),  # implicit output
    ("i,->i", [(3,), ()]),  # a scalar operand
    ("bij,bjk,bkl->bil", [(2, 2, 3), (2, 3, 2), (2, 2, 3)]),
    ("aab,bc,ca->b", [(2, 2, 3), (3, 2), (2, 2)]),
]


@pytest.mark.parametrize("spec,shapes", CASES, ids=[c[0] for c in CASES])
def test_einsum_grad(spec, shapes):
    g = tl.EinsumGraph()
    xs = [g.input(f"x{k}", s, "float64") for k, s in enumerate(shapes)]
    g.output(g.einsum(spec, *xs), "y")
    assert_grads_agree(g, "y", [f"x{k}" for k in range(len(shapes))], backends=CPU)


def test_same_operand_twice():
    g = tl.EinsumGraph()
    x = g.input("x", (3, 4), "float32")
    g.output(g.einsum("ij,ij->", x, x), "loss")  # sum(x^2): gradient 2x
    out = tl.compile(tl.grad(g, "loss", ["x"]), backend="numpy")(x=np.full((3, 4), 1.5, np.float32))
    np.testing.assert_allclose(out["grad_x"], np.full((3, 4), 3.0), rtol=1e-6)


def test_symbolic_batch_and_ellipsis():
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 3, 4), "float64")
    w = g.input("w", (4, 2), "float64")
    y = g.einsum("...i,ij->...j", x, w)
    g.output(g.mean(g.tanh(y)), "loss")
    assert_grads_agree(g, "loss", ["x", "w"], backends=CPU, sizes={"B": 2})


def test_more_than_52_indices():
    # a chain of 60 small matrices through the interleaved form: 61 distinct indices
    rng = np.random.default_rng(0)
    g = tl.EinsumGraph()
    mats = [g.input(f"m{k}", (2, 2), "float64") for k in range(60)]
    args = []
    for k, m in enumerate(mats):
        args += [m, [k, k + 1]]
    y = g.einsum(*args, [0, 60])
    g.output(g.sum(y * y), "loss")
    back = tl.grad(g, "loss", ["m0", "m30"])
    assert any(
        not all(c.isascii() for c in n.args["spec"]) for n in back.nodes if n.kind == "einsum"
    )
    feed = {f"m{k}": rng.uniform(0.6, 0.9, (2, 2)) for k in range(60)}
    out = tl.compile(back, backend="numpy", opt_level=2)(**feed)
    # the gradient wrt m30: the chain before it, transposed, times 2Y, times the chain after
    sym = [opt_einsum.get_symbol(k) for k in range(61)]
    before = opt_einsum.contract(
        ",".join(sym[k] + sym[k + 1] for k in range(30)) + f"->{sym[0]}{sym[30]}",
        *[feed[f"m{k}"] for k in range(30)],
    )
    after = opt_einsum.contract(
        ",".join(sym[k] + sym[k + 1] for k in range(31, 60)) + f"->{sym[31]}{sym[60]}",
        *[feed[f"m{k}"] for k in range(31, 60)],
    )
    y = before @ feed["m30"] @ after
    want = before.T @ (2 * y) @ after.T
    np.testing.assert_allclose(out["grad_m30"], want, rtol=1e-10)
    assert_grads_agree(
        g,
        "loss",
        ["m0", "m59"],
        backends=("numpy",),
        opt_levels=(2,),
        ranges={f"m{k}": (0.6, 0.9) for k in range(60)},
    )
