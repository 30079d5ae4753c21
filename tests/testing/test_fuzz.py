"""Differential fuzzing: random graphs on every backend and opt level against numpy at O0.

Each run draws a fresh seed (printed; pass ``--fuzz-seed=N`` to replay it) and checks at least
``CPU_GRAPHS`` graphs on the CPU backends, within a time box that keeps CI fast. On a failure
hypothesis shrinks the graph and prints it with the seed of its inputs.
"""

from __future__ import annotations

import secrets
import time
import warnings

import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

import tensorlogic as tl
from tensorlogic.testing import assert_backends_agree, graph_cases

CPU_GRAPHS = 2000
CPU_TIME_BOX_S = 200.0
SLOW_SHARE = 0.5
GPU_GRAPHS = 500
GPU_TIME_BOX_S = 300.0
# 16-bit graphs (bfloat16, float16; their tolerances follow the dtype's epsilon)
HALF = ("bfloat16", "float16")
HALF_GRAPHS = 300
HALF_TIME_BOX_S = 60.0
OPT_LEVELS = (0, 1, 2, 3)


@pytest.fixture
def fuzz_seed(request) -> int:
    """The run's seed: --fuzz-seed or a fresh one, printed for reproduction."""
    value = request.config.getoption("--fuzz-seed")
    value = secrets.randbits(32) if value is None else value
    print(f"differential fuzz seed: {value} (replay with --fuzz-seed={value})")
    return value


def _fuzz(
    backends: tuple[str, ...],
    n_graphs: int,
    time_box: float,
    run_seed: int,
    dtypes: tuple[str, ...] = ("float32", "float64"),
) -> dict:
    """Check up to ``n_graphs`` graphs. Backends other than numpy (whose kernels are compiled
    per graph, so each costs far more) share the first ``SLOW_SHARE`` of the time box; after that
    the remaining graphs still run on numpy at every opt level."""
    stats = {"checked": 0, "skipped": 0, "per_backend": {b: 0 for b in backends}, "ops": {}}
    start = time.monotonic()
    deadline = start + time_box
    slow_deadline = start + SLOW_SHARE * time_box

    @seed(run_seed)
    @settings(
        max_examples=n_graphs,
        deadline=None,
        database=None,
        derandomize=False,
        suppress_health_check=list(HealthCheck),
        print_blob=True,
    )
    @given(case=graph_cases(dtypes=dtypes), input_seed=st.integers(0, 2**32 - 1))
    def check(case, input_seed):
        now = time.monotonic()
        if now > deadline:
            stats["skipped"] += 1
            return
        run_on = backends if now < slow_deadline or "numpy" not in backends else ("numpy",)
        assert_backends_agree(
            case.graph,
            backends=run_on,
            opt_levels=OPT_LEVELS,
            ranges=case.ranges,
            sizes=case.sizes,
            seed=input_seed,
        )
        stats["checked"] += 1
        for b in run_on:
            stats["per_backend"][b] += 1
        for op in case.ops_used:
            stats["ops"][op] = stats["ops"].get(op, 0) + 1

    try:
        check()
    except Exception as exc:
        exc.add_note(f"differential fuzz seed: {run_seed} (replay with --fuzz-seed={run_seed})")
        raise
    return stats


def _report(stats: dict, n_graphs: int, backends: tuple[str, ...], run_seed: int) -> None:
    print(
        f"checked {stats['checked']} graphs at O{OPT_LEVELS}; graphs per backend "
        f"{stats['per_backend']}; ops {stats['ops']}"
    )
    if stats["checked"] < n_graphs:
        warnings.warn(
            f"differential fuzz (seed {run_seed}) hit its time box after "
            f"{stats['checked']} of {n_graphs} graphs",
            stacklevel=2,
        )


def test_differential_fuzz_cpu(fuzz_seed):
    # the library's own CPU backends (tests elsewhere register toy backends of their own)
    backends = tuple(b for b in tl.available_backends() if b in ("numpy", "numba"))
    stats = _fuzz(backends, CPU_GRAPHS, CPU_TIME_BOX_S, fuzz_seed)
    _report(stats, CPU_GRAPHS, backends, fuzz_seed)
    # the time box is a guard for slow machines, not the plan: most of the run must happen
    assert stats["checked"] >= CPU_GRAPHS // 4


@pytest.mark.gpu
def test_differential_fuzz_gpu(fuzz_seed):
    if "cupy" not in tl.backends.registered_backends():
        pytest.skip("the cupy backend is not registered in this build")
    stats = _fuzz(("cupy",), GPU_GRAPHS, GPU_TIME_BOX_S, fuzz_seed)
    _report(stats, GPU_GRAPHS, ("cupy",), fuzz_seed)
    assert stats["checked"] >= GPU_GRAPHS // 4


def test_differential_fuzz_half_cpu(fuzz_seed):
    backends = tuple(b for b in tl.available_backends() if b in ("numpy", "numba"))
    stats = _fuzz(backends, HALF_GRAPHS, HALF_TIME_BOX_S, fuzz_seed, HALF)
    _report(stats, HALF_GRAPHS, backends, fuzz_seed)
    assert stats["checked"] >= HALF_GRAPHS // 4


@pytest.mark.gpu
def test_differential_fuzz_half_gpu(fuzz_seed):
    if "cupy" not in tl.backends.registered_backends():
        pytest.skip("the cupy backend is not registered in this build")
    stats = _fuzz(("cupy",), GPU_GRAPHS // 10, GPU_TIME_BOX_S / 10, fuzz_seed, HALF)
    _report(stats, GPU_GRAPHS // 10, ("cupy",), fuzz_seed)
    assert stats["checked"] >= GPU_GRAPHS // 40
