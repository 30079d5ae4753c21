"""Integer, bool and complex einsums: compiled plans vs np.einsum and opt_einsum.contract.

Every contender is numpy-based (no foreign thread pools), so they are sampled round-robin in one
process. Results are checked first: integer and bool results bit for bit against np.einsum.
Usage: python benchmarks/bench_dtypes.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np
import opt_einsum

import tensorlogic as tl
from tensorlogic.testing.einsum_calls import random_array

from _common import cores_look_free, interleaved_times, machine, table, write_results

CASES = [
    ("int8 matmul", "ij,jk->ik", [(256, 256), (256, 256)], "int8"),
    ("int32 matmul", "ij,jk->ik", [(256, 256), (256, 256)], "int32"),
    ("int64 batched", "bij,bjk->bik", [(16, 64, 64), (16, 64, 64)], "int64"),
    ("int32 three_op", "abc,bcd,cde->ae", [(24, 24, 24)] * 3, "int32"),
    ("bool matmul", "ij,jk->ik", [(256, 256), (256, 256)], "bool"),
    ("complex64 matmul", "ij,jk->ik", [(256, 256), (256, 256)], "complex64"),
    ("complex128 chain", "ab,bc,cd,de->ae", [(24, 24)] * 4, "complex128"),
    (
        "complex128 circuit",
        "abcd,ce,df,efgh->abgh",
        [(8, 8, 8, 8), (8, 8), (8, 8), (8, 8, 8, 8)],
        "complex128",
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer samples")
    args = ap.parse_args()
    repeat = 5 if args.quick else 11
    rng = np.random.default_rng(0)
    rows = []
    for name, spec, shapes, dt in CASES:
        ops_ = [random_array(rng, s, dt) for s in shapes]
        g = tl.EinsumGraph()
        ins = [g.input(f"x{k}", s, dt) for k, s in enumerate(shapes)]
        g.output(g.einsum(spec, *ins), "y")
        plan = tl.compile(g, backend="numpy", opt_level=2)
        feeds = {f"x{k}": a for k, a in enumerate(ops_)}
        got, want = plan(feeds)["y"], np.einsum(spec, *ops_)
        assert got.dtype == want.dtype, name
        if want.dtype.kind in "biu":
            assert np.array_equal(got, want), name
        else:
            assert np.allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max()), name
        t = interleaved_times(
            {
                "ours": lambda: plan(feeds),
                "np.einsum": lambda: np.einsum(spec, *ops_),
                "np.einsum(optimize)": lambda: np.einsum(spec, *ops_, optimize=True),
                "opt_einsum": lambda: opt_einsum.contract(spec, *ops_),
            },
            repeat=repeat,
            warmup=1,
        )
        rows.append(
            {
                "case": name,
                "spec": spec,
                "dtype": dt,
                **{f"{k} ms": v * 1e3 for k, v in t.items()},
                "np.einsum/ours": t["np.einsum"] / t["ours"],
                "opt_einsum/ours": t["opt_einsum"] / t["ours"],
            }
        )
        print(
            f"{name}: ours {t['ours'] * 1e3:.3g} ms, np.einsum {t['np.einsum'] * 1e3:.3g} ms",
            flush=True,
        )
    print(
        table(
            rows,
            [
                "case",
                "ours ms",
                "np.einsum ms",
                "np.einsum(optimize) ms",
                "opt_einsum ms",
                "np.einsum/ours",
                "opt_einsum/ours",
            ],
        )
    )
    m = machine()
    print(
        f"machine: {m['cpu']}, {m['cores_usable']} cores, load {m['loadavg_1min']:.1f}"
        + ("" if cores_look_free() else " (busy: timings are noisy)")
    )
    print("wrote", write_results("bench_dtypes", rows))


if __name__ == "__main__":
    main()
