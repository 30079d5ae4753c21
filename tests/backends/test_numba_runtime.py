"""Disk cache reuse across processes, concurrency, and exp/log accuracy of the fast math."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.backends import get_backend
from tensorlogic.backends.numba import threads as numba_threads
from tensorlogic.ir.fused import FusedBody, FusedOp

from numba_cases import fused_graph, random_inputs, reference, tol
from conftest import run_in_threads

_SCRIPT = textwrap.dedent("""
    import json, numpy as np, tensorlogic as tl
    from tensorlogic.backends.numba import cache as numba_cache
    g = tl.EinsumGraph()
    x = g.input("x", (50, 20), "float32")
    g.output(g.softmax(g.exp(x) * 0.5 + 1.25), "y")
    plan = tl.compile(g, backend="numba", opt_level=0)
    y = plan(x=np.linspace(-1, 1, 1000, dtype=np.float32).reshape(50, 20))["y"]
    d = [s for s in plan.concrete.kernels]
    print(json.dumps({"hits": sum(sum(k.impl.stats.cache_hits.values()) for k in d),
                      "misses": sum(sum(k.impl.stats.cache_misses.values()) for k in d),
                      "dir": str(numba_cache.cache_root()), "sum": float(y.sum())}))
""")


def _run(env):
    out = subprocess.run(
        [sys.executable, "-c", _SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_reuses_disk_cache(tmp_path):
    # numba's own cache directory variable must not move our objects: config.py decides
    env = dict(os.environ, TL_CACHE_DIR=str(tmp_path), NUMBA_CACHE_DIR=str(tmp_path / "nb_env"))
    first = _run(env)
    second = _run(env)
    assert first["dir"] == second["dir"] == str(tmp_path / "numba")
    assert first["misses"] == 4 and first["hits"] == 0  # mul, add, exp, softmax compiled
    assert second["hits"] == 4 and second["misses"] == 0  # nothing compiled again
    assert first["sum"] == pytest.approx(50.0, rel=1e-5) and second["sum"] == first["sum"]
    modules = sorted(p.name for p in (tmp_path / "numba").glob("tl_*.py"))
    assert len(modules) == 4
    assert len(list((tmp_path / "numba").glob("*.nbi"))) >= 4
    assert not list(tmp_path.glob("nb_env/**/*.nbi"))


_EVERY_KIND = textwrap.dedent("""
    import json, sys, numpy as np, tensorlogic as tl
    sys.path.insert(0, sys.argv[1])
    from numba_cases import EVERY_KIND_OPTIONS, every_kind_graph, every_kind_inputs, libm_graph
    rng = np.random.default_rng(int(sys.argv[2]))
    runs = [(every_kind_graph(dt), every_kind_inputs(rng, dt), opts)
            for dt, opts in EVERY_KIND_OPTIONS.items()]
    runs.append((libm_graph(), {"x": rng.uniform(-5, 5, (9, 11))}, {"fast_math": False}))
    res = {"misses": 0, "err": {}}
    for g, xs, opts in runs:
        plan = tl.compile(g, backend="numba", opt_level=0, **opts)
        got = plan(**xs)
        want = tl.compile(g, backend="numpy", opt_level=0)(**xs)
        for k in want:
            d = np.abs(got[k].astype(np.float64) - want[k]) / (1 + np.abs(want[k]))
            res["err"][f"{want[k].dtype}:{opts}:{k}"] = float(d.max())
        res["misses"] += sum(sum(k.impl.stats.cache_misses.values())
                             for k in plan.concrete.kernels if k.impl is not None)
    print(json.dumps(res))
""")


def test_warm_process_runs_every_kernel_kind_from_cache():
    """A process that only loads cached objects (no compile, no registry refresh) is correct.

    Uses the session's cache directory: the objects are usually there already (test_numba_ops
    compiles the same graphs with the same options), so the first run is cheap.
    """
    here = os.path.dirname(__file__)
    seed = int(np.random.default_rng().integers(2**31))
    outs = []
    for _ in range(2):
        out = subprocess.run(
            [sys.executable, "-c", _EVERY_KIND, here, str(seed)],
            capture_output=True,
            text=True,
            timeout=600,
            check=True,
        )
        outs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert outs[1]["misses"] == 0, outs[1]
    for name, err in outs[1]["err"].items():
        bound = 1e-4 if name.startswith("float32") else 1e-12
        assert err <= bound, (name, err)
    assert outs[1]["err"] == outs[0]["err"]  # cached objects compute what fresh ones did


def test_four_threads_call_plans_concurrently(rng):
    shapes = [(256, 300), (300,), (256, 1), (256, 300), (256, 300)]
    instrs = [
        ("mul", [("in", 0), ("in", 1)]),
        ("add", [("tmp", 0), ("in", 2)]),
        ("relu", [("tmp", 1)]),
        ("mul", [("tmp", 2), ("in", 3)]),
        ("sub", [("tmp", 3), ("in", 4)]),
    ]
    plans = [
        tl.compile(
            fused_graph(shapes, "float32", instrs, (256, 300)),
            backend="numba",
            opt_level=0,
            parallel_threshold=0,
        ),
        tl.compile(
            fused_graph(shapes[:1], "float32", [("exp", [("in", 0)])], (256, 300), "softmax", (1,)),
            backend="numba",
            opt_level=0,
            parallel_threshold=0,
        ),
    ]
    cases = []
    for _ in range(4):
        xs = random_inputs(rng, shapes, "float32")
        want0 = reference(shapes, "float32", instrs, inputs=xs)
        want1 = reference(
            shapes[:1], "float32", [("exp", [("in", 0)])], "softmax", (1,), inputs={"x0": xs["x0"]}
        )
        cases.append((xs, want0, want1))
    plans[0](**cases[0][0])
    errors = []
    barrier = threading.Barrier(4)

    def worker(k):
        xs, want0, want1 = cases[k]
        try:
            barrier.wait()
            for _ in range(25):
                np.testing.assert_allclose(plans[0](**xs)["y"], want0, **tol("float32"))
                np.testing.assert_allclose(plans[1](x0=xs["x0"])["y"], want1, **tol("float32", 300))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    run_in_threads(worker, 4)
    assert not errors, errors[0]
    layer = numba_threads.active_layer()
    assert layer in ("tbb", "omp", "workqueue")
    if numba_threads._loadable("omp") or numba_threads._loadable("tbb"):
        assert layer != "workqueue"


def _ulps(got, x, fn, dtype):
    ref = fn(x.astype(np.longdouble))
    with np.errstate(over="ignore"):  # results beyond the dtype's range are excluded below
        r = ref.astype(dtype)
    ok = np.isfinite(r)
    err = np.abs(got[ok].astype(np.longdouble) - ref[ok]) / np.spacing(np.abs(r[ok])).astype(
        np.longdouble
    )
    return float(err.max())


@pytest.mark.parametrize("dtype,bound", [("float32", 2.0), ("float64", 4.0)])
def test_fast_exp_log_accuracy_dense_sweep(dtype, bound):
    be = get_backend("numba")
    fi = np.finfo(dtype)
    n = 1_000_003
    lo, hi = float(np.log(fi.smallest_subnormal)), float(np.log(fi.max))
    xs_exp = np.concatenate([np.linspace(lo - 1, hi, n), np.linspace(-1, 1, n)]).astype(dtype)
    lg_lo, lg_hi = np.log2(float(fi.smallest_subnormal)), np.log2(float(fi.max))
    with np.errstate(over="ignore"):  # the top of the sweep rounds past the max: dropped below
        xs_log = np.concatenate(
            [np.exp2(np.linspace(lg_lo, lg_hi, n)), np.linspace(0.5, 2, n)]
        ).astype(dtype)
    xs_log = xs_log[np.isfinite(xs_log)]
    xs_log = xs_log[xs_log > 0]
    worst = {}
    for op, xs, fn in (("exp", xs_exp, np.exp), ("log", xs_log, np.log)):
        body = FusedBody((FusedOp(op, (("in", 0),)),), (xs.size,))
        k = be.kernel_for(body, [xs.shape], dtype, fast=True, threshold=0)
        assert "fast" in k.info and f"_{op}_f" in k.source
        out = k([xs], np.empty_like(xs))
        worst[op] = _ulps(out, xs, fn, dtype)
        assert worst[op] <= bound, (op, worst[op])
    print(f"{dtype} max ulp error: {worst}")
    # special values behave like libm
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -1.0, fi.max, fi.smallest_subnormal], dtype)
    body_e = FusedBody((FusedOp("exp", (("in", 0),)),), sp.shape)
    body_l = FusedBody((FusedOp("log", (("in", 0),)),), sp.shape)
    e = be.kernel_for(body_e, [sp.shape], dtype)([sp], np.empty_like(sp))
    lg = be.kernel_for(body_l, [sp.shape], dtype)([sp], np.empty_like(sp))
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(e, np.exp(sp), rtol=4 * fi.eps)
        np.testing.assert_allclose(lg, np.log(sp), rtol=4 * fi.eps)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", ["exp", "tanh"])
def test_fast_exp_tanh_written_over_their_input_match_numpy(name, dtype, rng):
    # a loop writing f(x) over x: the special values come from the arithmetic, not from a
    # select of x (which compiles to a masked store, microcoded on AMD cores)
    import numba

    from tensorlogic.backends.numba import fastmath as numba_fastmath
    from tensorlogic.backends.numba.codegen import FAST_FLAGS

    fn = getattr(numba_fastmath, f"{name}_{'f32' if dtype == 'float32' else 'f64'}")

    @numba.njit(fastmath=set(eval(FAST_FLAGS)), error_model="numpy")
    def in_place(a):
        for i in range(a.size):
            a[i] = fn(a[i])

    fi = np.finfo(dtype)
    special = [np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, fi.max, -fi.max, fi.tiny, -1e3]
    x = np.concatenate([np.array(special), rng.standard_normal(1021) * 30]).astype(dtype)
    got = x.copy()
    in_place(got)
    with np.errstate(all="ignore"):
        want = getattr(np, name)(x)
    np.testing.assert_allclose(got, want, rtol=8 * fi.eps, atol=0)
    assert np.array_equal(np.signbit(got[4:6]), np.signbit(want[4:6]))  # exp(-0) = 1, tanh(-0) = -0


@pytest.mark.parametrize("dtype,bound", [("float32", 2.0), ("float64", 4.0)])
def test_fast_tanh_log1p_accuracy_dense_sweep(dtype, bound):
    # tanh through the generated kernel (the fast path must be the one taken), log1p directly
    import numba

    from tensorlogic.backends.numba import fastmath as numba_fastmath
    from tensorlogic.backends.numba.codegen import FAST_FLAGS

    be = get_backend("numba")
    n = 1_000_003
    xt = np.concatenate(
        [np.linspace(-30, 30, n), np.linspace(-1, 1, n), np.linspace(-1e-3, 1e-3, n)]
    ).astype(dtype)
    body = FusedBody((FusedOp("tanh", (("in", 0),)),), (xt.size,))
    k = be.kernel_for(body, [xt.shape], dtype, fast=True, threshold=0)
    assert "_tanh_f" in k.source
    worst = {"tanh": _ulps(k([xt], np.empty_like(xt)), xt, np.tanh, dtype)}
    fn = getattr(numba_fastmath, f"log1p_{'f32' if dtype == 'float32' else 'f64'}")

    @numba.njit(fastmath=set(eval(FAST_FLAGS)), error_model="numpy")  # as in kernels
    def run(a, o):
        for i in range(a.size):
            o[i] = fn(a[i])

    xl = np.concatenate(
        [np.linspace(-0.999, 1, n), np.linspace(-1e-3, 1e-3, n), np.exp2(np.linspace(-60, 100, n))]
    ).astype(dtype)
    out = np.empty_like(xl)
    run(xl, out)
    worst["log1p"] = _ulps(out, xl, np.log1p, dtype)
    print(f"{dtype} max ulp error: {worst}")
    assert max(worst.values()) <= bound, worst
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1.0, -2.0, 1e-30], dtype)
    out = np.empty_like(sp)
    run(sp, out)
    with np.errstate(all="ignore"):
        np.testing.assert_allclose(out, np.log1p(sp), rtol=4 * np.finfo(dtype).eps)
        ks = be.kernel_for(
            FusedBody((FusedOp("tanh", (("in", 0),)),), sp.shape),
            [sp.shape],
            dtype,
            fast=True,
            threshold=0,
        )
        t = ks([sp], np.empty_like(sp))
        np.testing.assert_allclose(t, np.tanh(sp), rtol=4 * np.finfo(dtype).eps)
        assert np.signbit(t[4]) and not np.signbit(t[3])


def _gelu_ref(x):
    x = x.astype(np.longdouble)
    u = np.longdouble(0.7978845608028654) * (x + np.longdouble(0.044715) * x**3)
    # x * sigmoid(2u), without the cancellation of 1 + tanh(u) for negative x
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-2 * u))


def _numba_unary(op: str, x: np.ndarray, fast: bool) -> np.ndarray:
    """``op`` applied to ``x`` by a one-op numba fused kernel."""
    body = FusedBody((FusedOp(op, (("in", 0),)),), x.shape)
    k = get_backend("numba").kernel_for(body, [x.shape], x.dtype.name, fast=fast, threshold=0)
    return k([x], np.empty_like(x))


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_gelu_relative_accuracy_and_special_values(dtype, fast):
    # the numba kernel computes gelu as x / (1 + exp(-2u)): relative error stays small where
    # 1 + tanh(u) would cancel (x down to -10), bounded by the rounding of the exp argument 2u
    eps = float(np.finfo(dtype).eps)
    xs = np.concatenate([np.linspace(-10, 10, 400_001), np.linspace(-1e-3, 1e-3, 1001)])
    xs = xs.astype(dtype)
    got = _numba_unary("gelu", xs, fast).astype(np.longdouble)
    ref = _gelu_ref(xs)
    two_u = np.abs(2 * 0.7978845608028654 * (xs + 0.044715 * xs.astype(np.float64) ** 3))
    tiny = float(np.finfo(dtype).tiny)
    err = np.abs(got - ref)
    bound = 8 * eps * (1 + two_u) * np.abs(ref) + tiny
    assert np.all(err <= bound), float(np.max(err / (np.abs(ref) + tiny)))
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -50.0, -1e30, 50.0], dtype)
    with np.errstate(all="ignore"):
        t = _numba_unary("gelu", sp, fast)
        want = 0.5 * sp * (1 + np.tanh(0.7978845608028654 * (sp + 0.044715 * sp**3)))
    # nan -> nan, inf -> inf, -inf -> nan (inf * 0 in the tanh form too), zeros and the far
    # negative side -> 0, large x -> x
    np.testing.assert_array_equal(np.isnan(t), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_allclose(t[ok], want[ok], rtol=4 * eps, atol=tiny)


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_sigmoid_relative_accuracy_and_special_values(dtype, fast):
    # the numba kernel computes sigmoid as 1 / (1 + exp(-x)): relative error stays small on the
    # negative side, where 0.5 tanh(x/2) + 0.5 cancels, bounded by exp's error on -x
    eps = float(np.finfo(dtype).eps)
    xs = np.concatenate([np.linspace(-80, 30, 400_001), np.linspace(-1e-3, 1e-3, 1001)])
    xs = xs.astype(dtype)
    got = _numba_unary("sigmoid", xs, fast).astype(np.longdouble)
    ref = 1 / (1 + np.exp(-xs.astype(np.longdouble)))
    tiny = float(np.finfo(dtype).tiny)
    bound = 8 * eps * (1 + np.abs(xs.astype(np.float64))) * np.abs(ref) + tiny
    assert np.all(np.abs(got - ref) <= bound)
    sp = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, -1e30, 1e30, -200.0], dtype)
    with np.errstate(all="ignore"):
        t = _numba_unary("sigmoid", sp, fast)
        want = (1 / (1 + np.exp(-sp.astype(np.longdouble)))).astype(dtype)  # nan, 1, 0, ...
    np.testing.assert_allclose(t, want, rtol=4 * eps, atol=tiny)  # NaN where want is NaN
    np.testing.assert_array_equal(t[:7], np.array([np.nan, 1, 0, 0.5, 0.5, 0, 1], dtype))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_float_keys_preserve_order_and_round_trip(dtype, rng):
    import numba

    from tensorlogic.backends.numba import fastmath as numba_fastmath

    sfx = "f32" if dtype == "float32" else "f64"
    key, unkey = getattr(numba_fastmath, f"key_{sfx}"), getattr(numba_fastmath, f"unkey_{sfx}")

    @numba.njit
    def run(a, k, back):
        for i in range(a.size):
            k[i] = key(a[i])
            back[i] = unkey(k[i])

    fi = np.finfo(dtype)
    special = [
        -np.inf,
        -fi.max,
        -1.0,
        -fi.tiny,
        -fi.smallest_subnormal,
        -0.0,
        0.0,
        fi.smallest_subnormal,
        fi.tiny,
        1.0,
        fi.max,
        np.inf,
    ]
    wide = rng.standard_normal(5000) * 10.0 ** rng.integers(-30, 30, 5000)
    x = np.sort(np.concatenate([special, wide]).astype(dtype), kind="stable")
    kdt = np.int32 if dtype == "float32" else np.int64  # float32 keys are int32 (8 AVX2 lanes)
    k = np.empty(x.size, kdt)
    back = np.empty_like(x)
    run(x, k, back)
    assert np.array_equal(back.view(np.uint8), x.view(np.uint8))  # bit-exact, -0.0 included
    assert np.all(np.diff(k) >= 0)  # sorted floats give sorted keys
    strict = np.diff(x) > 0
    assert np.all(np.diff(k)[strict] > 0)
    nan_key = np.empty(1, kdt)
    run(np.array([np.nan], dtype), nan_key, np.empty(1, dtype))
    assert nan_key[0] > k.max()  # a (positive) NaN is above +inf


@pytest.mark.parametrize("op", ["softmax", "log_softmax"])
def test_row_ops_with_nan_and_inf_rows_match_numpy(op):
    x = np.array(
        [
            [1.0, 2.0, 3.0],
            [np.nan, 0.0, 1.0],
            [np.inf, 0.0, 1.0],
            [-np.inf, 0.0, 1.0],
            [-np.inf, -np.inf, -np.inf],
            [-0.0, 0.0, -1e30],
        ],
        np.float32,
    )
    g = tl.EinsumGraph()
    xi = g.input("x", x.shape, "float32")
    g.output(g._rowop(op, xi, 1, None), "y")
    got = tl.compile(g, backend="numba", opt_level=0)(x=x)["y"]
    want = tl.compile(g, backend="numpy", opt_level=0)(x=x)["y"]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_gomp_environment_respects_user_settings(monkeypatch):
    from tensorlogic import config

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    assert config.gomp_environment(cpus=2) == {"OMP_WAIT_POLICY": "passive"}
    assert config.gomp_environment(cpus=config.SPIN_MIN_CPUS - 1) == {"OMP_WAIT_POLICY": "passive"}
    spin = {"GOMP_SPINCOUNT": str(config.SPIN_COUNT)}
    assert config.gomp_environment(cpus=config.SPIN_MIN_CPUS) == spin
    assert config.gomp_environment(cpus=64) == spin
    # the default reads the process's CPUs
    want = spin if config.process_cpus() >= config.SPIN_MIN_CPUS else {"OMP_WAIT_POLICY": "passive"}
    assert config.gomp_environment() == want
    for cpus in (2, 16):
        monkeypatch.setenv("OMP_WAIT_POLICY", "active")
        assert config.gomp_environment(cpus=cpus) == {}
        monkeypatch.delenv("OMP_WAIT_POLICY")
        monkeypatch.setenv("GOMP_SPINCOUNT", "5")
        assert config.gomp_environment(cpus=cpus) == {}
        monkeypatch.delenv("GOMP_SPINCOUNT")


_GOMP = textwrap.dedent("""
    import os, numpy as np, tensorlogic as tl
    g = tl.EinsumGraph()
    x = g.input("x", (1 << 16,), "float32")
    g.output(g.exp(x) * 2.0, "y")
    y = tl.compile(g, backend="numba", opt_level=0, parallel_threshold=0)(
        x=np.ones(1 << 16, np.float32))["y"]
    assert np.allclose(y, 2 * np.e)
    print(os.environ.get("GOMP_SPINCOUNT"), os.environ.get("OMP_WAIT_POLICY"))
""")


@pytest.mark.parametrize(
    "user,want_env,want_policy",
    [
        ({}, "None None", None),  # exported while libgomp loads, then taken back
        ({"OMP_WAIT_POLICY": "active"}, "None active", "ACTIVE"),  # the user's setting wins
    ],
)
def test_backend_sets_gomp_policy_while_openmp_loads(user, want_env, want_policy):
    from tensorlogic import config

    if not numba_threads._loadable("omp"):
        pytest.skip("numba's OpenMP layer is not loadable here")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    # OMP_DISPLAY_ENV makes libgomp print the settings it read when it loaded
    env = {**env, **user, "OMP_DISPLAY_ENV": "VERBOSE"}
    out = subprocess.run(
        [sys.executable, "-c", _GOMP],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    assert out.stdout.strip().splitlines()[-1] == want_env
    shown = out.stderr + out.stdout
    if want_policy is None:  # our default for this machine's CPUs (the child has the same)
        if config.process_cpus() >= config.SPIN_MIN_CPUS:
            assert f"GOMP_SPINCOUNT = '{config.SPIN_COUNT}'" in shown
        else:
            assert "OMP_WAIT_POLICY = 'PASSIVE'" in shown
            assert "GOMP_SPINCOUNT = '0'" in shown  # passive: no spinning at all
    else:
        assert f"OMP_WAIT_POLICY = '{want_policy}'" in shown
