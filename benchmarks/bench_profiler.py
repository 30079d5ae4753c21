"""Profiler overhead: a 500-step plan of small ops with the profiler on, off, and not built in.

* on: ``with tl.profile()`` around the calls; overhead per step = (profiled - plain) / steps.
  Target: at most 5 us per step on the CPU. Peer: the same calls under cProfile.
* off: the executor's normal path (one observer check per call) against a copy of the same
  executor loop with no observer check at all (what an unprofiled build would run), measured
  interleaved. Target: within 2%.
* GPU (when a backend timed with device events is available, e.g. cupy): the sum of the step
  times of a call against the call's wall time (synchronized). Target: within 10%.

Usage: python benchmarks/bench_profiler.py [--quick]
"""

from __future__ import annotations

import argparse
import cProfile
import statistics
import time

import numpy as np

import tensorlogic as tl

from _common import cores_look_free, median_time, table, write_results

STEPS = 500


def chain_plan(backend: str, n: int, steps: int) -> tl.CompiledPlan:
    """``steps`` small elementwise ops in a row (opt level 0: nothing fuses them away)."""
    g = tl.EinsumGraph()
    x = g.input("x", shape=(n,), dtype="float32")
    y = x
    for k in range(steps):
        y = y * 0.999 if k % 2 else y + 0.001
    g.output(y, name="y")
    return tl.compile(g, backend=backend, opt_level=0, cache=False)


def unobserved_run(cp, inputs):
    """ConcretePlan.run as it would be without the profiler's hook: same work, no check."""
    env = cp.pool.acquire()
    try:
        for name, bid in cp.input_ids.items():
            env[bid] = inputs[name]
        results = {}
        for bid in cp.output_ids.values():
            b = cp.buffers[bid]
            env[bid] = cp.backend.empty(b.shape, b.dtype)
        with np.errstate(all="ignore"):
            for fn, ins, o in cp.program:
                env[o] = fn([env[i] for i in ins], env[o])
        for name, bid in cp.output_ids.items():
            results[name] = env[bid]
        return results
    finally:
        for bid in cp.input_ids.values():
            env[bid] = None
        for bid in cp.output_ids.values():
            env[bid] = None
        cp.pool.release(env)


def bench_cpu(repeat: int) -> tuple[list[dict], dict]:
    plan = chain_plan("numpy", 16, STEPS)
    cp = plan.concrete
    x = np.random.default_rng(0).standard_normal(16).astype(np.float32)
    feed = {"x": x}
    ref = x.copy()
    for k in range(STEPS):
        ref = ref * np.float32(0.999) if k % 2 else ref + np.float32(0.001)
    np.testing.assert_allclose(plan(feed)["y"], ref, rtol=1e-5)

    # interleave the variants so machine noise hits all of them alike
    off, bare, on, build = [], [], [], []
    for _ in range(repeat):
        off.append(median_time(lambda: cp.run(feed, None), 5, warmup=1, min_time=0.02))
        bare.append(median_time(lambda: unobserved_run(cp, feed), 5, warmup=1, min_time=0.02))
        with tl.profile() as prof:
            on.append(median_time(lambda: cp.run(feed, None), 5, warmup=1, min_time=0.02))
        t0 = time.perf_counter()
        n_events = len(prof.steps)  # events are built on first access, after recording
        build.append((time.perf_counter() - t0) / n_events)
        assert n_events % STEPS == 0 and n_events >= 6 * STEPS
    t_off, t_bare, t_on = (statistics.median(v) for v in (off, bare, on))
    t_plain = t_off
    build_step = statistics.median(build)

    profiler = cProfile.Profile()

    def under_cprofile() -> None:
        profiler.enable()
        for _ in range(20):
            cp.run(feed, None)
        profiler.disable()

    t_cprof = median_time(under_cprofile, max(3, repeat // 2), warmup=1) / 20
    rows = [
        {
            "variant": "unprofiled build (no hook)",
            "call_us": t_bare * 1e6,
            "per_step_us": t_bare / STEPS * 1e6,
            "vs_bare": 1.0,
        },
        {
            "variant": "tensorlogic, profiler off",
            "call_us": t_off * 1e6,
            "per_step_us": t_off / STEPS * 1e6,
            "vs_bare": t_off / t_bare,
        },
        {
            "variant": "tensorlogic, profiler on",
            "call_us": t_on * 1e6,
            "per_step_us": t_on / STEPS * 1e6,
            "vs_bare": t_on / t_bare,
        },
        {
            "variant": "cProfile (peer)",
            "call_us": t_cprof * 1e6,
            "per_step_us": t_cprof / STEPS * 1e6,
            "vs_bare": t_cprof / t_bare,
        },
    ]
    summary = {
        "steps": STEPS,
        "profiled_overhead_us_per_step": (t_on - t_plain) / STEPS * 1e6,
        "event_build_us_per_step": build_step * 1e6,
        "cprofile_overhead_us_per_step": (t_cprof - t_plain) / STEPS * 1e6,
        "off_vs_unprofiled_build": t_off / t_bare - 1.0,
        "target_on_us_per_step": 5.0,
        "target_off_ratio": 0.02,
    }
    return rows, summary


def bench_gpu(repeat: int) -> dict | None:
    """Sum of device step times vs the synchronized wall time of a call, if a device backend
    with event timing is available."""
    for name in tl.available_backends():
        be = tl.get_backend(name)
        if hasattr(be, "event") and hasattr(be, "event_seconds"):
            break
    else:
        return None
    plan = chain_plan(name, 1 << 22, 50)
    x = np.random.default_rng(0).standard_normal(1 << 22).astype(np.float32)
    xd = be.to_device(x)
    plan(x=xd)
    be.synchronize()
    walls, sums = [], []
    for _ in range(repeat):
        with tl.profile() as prof:
            t0 = time.perf_counter_ns()
            plan(x=xd)
            be.synchronize()
            wall = time.perf_counter_ns() - t0
        walls.append(wall)
        sums.append(sum(e.dur_ns for e in prof.steps))
    w, s = statistics.median(walls), statistics.median(sums)
    return {
        "backend": name,
        "steps": 50,
        "wall_us": w / 1e3,
        "step_sum_us": s / 1e3,
        "ratio": s / w,
        "target": "step sum within 10% of wall",
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short run (fewer repetitions)")
    args = ap.parse_args()
    repeat = 5 if args.quick else 21
    if not cores_look_free():
        print("note: the machine is busy (load average high); timings are noisy")
    rows, summary = bench_cpu(repeat)
    print(f"500-step plan of 16-element ops, numpy backend ({repeat} medians)")
    print(table(rows, ["variant", "call_us", "per_step_us", "vs_bare"]))
    print(
        f"profiler on: {summary['profiled_overhead_us_per_step']:.3f} us per step "
        f"(target <= 5 us); building events afterwards: "
        f"{summary['event_build_us_per_step']:.3f} us per step"
    )
    off = 100 * summary["off_vs_unprofiled_build"]
    print(f"profiler off vs a build without the hook: {off:+.2f}% (target within 2%)")
    gpu = bench_gpu(repeat)
    if gpu is None:
        print("GPU: skipped (no backend with device event timing here)")
    else:
        print(
            f"GPU ({gpu['backend']}): step sum {gpu['step_sum_us']:.1f} us vs wall "
            f"{gpu['wall_us']:.1f} us per call, ratio {gpu['ratio']:.3f}"
        )
    path = write_results("bench_profiler", rows, {"summary": summary, "gpu": gpu})
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
