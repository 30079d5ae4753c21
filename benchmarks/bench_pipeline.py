"""Batched inference: one big call vs run_batched on threads vs a 2-worker Dask LocalCluster.

Models: a 4-layer MLP (width 1024) and an attention block (per item: 16 tokens of width 64, 4
heads), 100,000 items, batches of 256 and 4096. Also measures how the last, smaller batch is best
run: its own (cached) plan vs padding it to the full batch size.
Target: run_batched reaches >= 90% of the one-big-call throughput at batch 4096.

Scale-out (--multi-gpu, on a host with two GPUs; --cpu-cluster, on the GPU host's CPUs): an
8-layer GELU MLP of width 4096, 32,768 rows of float32, batch 4096, on one GPU vs two, in one
process (devices=) and on a Dask cluster with one worker per GPU (dask-array input generated and
persisted on the workers, output persisted there; and numpy input through the client); a CPU
LocalCluster (workers x threads) vs one process. Every row is timed after a warm-up run, with
its one-device baseline in the same run. Targets: in-process 2 GPUs >= 1.8x one GPU; Dask 2 GPU
workers >= 1.7x one worker.
Usage: python benchmarks/bench_pipeline.py [--quick] [--no-dask] [--multi-gpu] [--cpu-cluster]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

import tensorlogic as tl
from tensorlogic.pipeline import trace_lanes

from _common import cores_look_free, machine, table, write_results

WIDTH, DEPTH = 1024, 4
SEQ, DIM, HEADS = 16, 64, 4


def mlp_graph(seed: int = 0, depth: int = DEPTH) -> tl.EinsumGraph:
    """x[B, 1024] -> depth x (relu(x W + b)) -> y[B, 1024] (4 layers by default)."""
    rng = np.random.default_rng(seed)
    g = tl.EinsumGraph()
    h = g.input("x", shape=("B", WIDTH))
    for k in range(depth):
        w = g.constant(
            (rng.standard_normal((WIDTH, WIDTH)) * WIDTH**-0.5).astype(np.float32), name=f"w{k}"
        )
        b = g.constant((rng.standard_normal(WIDTH) * 0.1).astype(np.float32), name=f"b{k}")
        h = g.relu(g.einsum("bi,ij->bj", h, w) + b)
    g.output(h, name="y")
    return g


def attention_graph(seed: int = 0) -> tl.EinsumGraph:
    """x[B, 16, 64] -> multi-head self-attention + residual -> y[B, 16, 64]."""
    rng = np.random.default_rng(seed)
    d = DIM // HEADS
    g = tl.EinsumGraph()
    x = g.input("x", shape=("B", SEQ, DIM))

    def w(name):
        return g.constant(
            (rng.standard_normal((DIM, HEADS, d)) * DIM**-0.5).astype(np.float32), name=name
        )

    q, k, v = (g.einsum("bsi,ihd->bhsd", x, w(n)) for n in ("wq", "wk", "wv"))
    attn = g.softmax(g.einsum("bhqd,bhkd->bhqk", q, k) * d**-0.5, axis=-1)
    ctx = g.einsum("bhqk,bhkd->bqhd", attn, v)
    g.output(g.reshape(ctx, ("B", SEQ, DIM)) + x, name="y")
    return g


def make_inputs(model: str, n: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    shape = (n, WIDTH) if model == "mlp" else (n, SEQ, DIM)
    return {"x": rng.standard_normal(shape, dtype=np.float32)}


def timed(fn, repeat: int, warm: bool = True) -> float:
    """Median seconds over ``repeat`` runs after one warm-up (compiles every batch size)."""
    if warm:
        fn()
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def persist_run(client, plan, xd, keep: bool):
    """One dask-array run persisted on the workers. Unless ``keep``, its result is cancelled
    before returning: the next run builds tasks with the same keys, and results still held by
    the workers would let it finish without computing (a first version timed 6 ms that way)."""
    from distributed import wait

    out = tl.run_batched(plan, {"x": xd}, client=client, progress=False)
    y = client.persist(out["y"])
    wait(y)
    if keep:
        return y
    keys = {k for k in y.__dask_keys__() for k in (k if isinstance(k, list) else [k])}
    client.cancel(y)
    del y
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and client.run_on_scheduler(
        lambda dask_scheduler, keys=keys: any(k in dask_scheduler.tasks for k in keys)
    ):
        time.sleep(0.005)  # until the scheduler has forgotten them
    return None


def check(got, ref, what):
    err = float(np.max(np.abs(got["y"] - ref["y"])) / (np.max(np.abs(ref["y"])) + 1e-30))
    assert err < 1e-4, f"{what}: relative error {err:.2e}"


def bench_model(model: str, n: int, batches: list[int], repeat: int, client) -> list[dict]:
    g = mlp_graph() if model == "mlp" else attention_graph()
    plan = tl.compile(g, backend="numpy", opt_level=2)
    inputs = make_inputs(model, n)
    ref = plan(inputs)
    rows = []
    t_big = timed(lambda: plan(inputs), repeat)
    rows.append(
        {
            "model": model,
            "mode": "one big call",
            "batch": n,
            "items_per_s": n / t_big,
            "vs_big": 1.0,
        }
    )
    for bs in batches:
        for workers in (1, 2):
            check(tl.run_batched(plan, inputs, bs, workers=workers, progress=False), ref, "threads")
            t = timed(
                lambda bs=bs, w=workers: tl.run_batched(
                    plan, inputs, bs, workers=w, progress=False
                ),
                repeat,
            )
            rows.append(
                {
                    "model": model,
                    "mode": f"run_batched threads={workers}",
                    "batch": bs,
                    "items_per_s": n / t,
                    "vs_big": t_big / t,
                }
            )
        if client is not None:
            check(tl.run_batched(plan, inputs, bs, client=client, progress=False), ref, "dask")
            t = timed(
                lambda bs=bs: tl.run_batched(plan, inputs, bs, client=client, progress=False),
                max(1, repeat // 2),
            )
            rows.append(
                {
                    "model": model,
                    "mode": "run_batched dask 2 workers",
                    "batch": bs,
                    "items_per_s": n / t,
                    "vs_big": t_big / t,
                }
            )
    for r in rows:
        print(
            f"  {model:9s} {r['mode']:28s} batch={r['batch']:<7d} "
            f"{r['items_per_s']:12.0f} items/s  {r['vs_big']:.2f}x big call",
            flush=True,
        )
    return rows


def bench_last_batch(model: str, full: int, last: int, repeat: int) -> dict:
    """The last, smaller batch: its own plan (first call compiles; later calls cached) vs
    padding it to the full batch size and slicing the result."""
    g = mlp_graph() if model == "mlp" else attention_graph()
    plan = tl.compile(g, backend="numpy", opt_level=2)
    x = make_inputs(model, full)["x"]
    plan(x=x)  # the full-size plan exists, as it does after the other batches
    part = x[:last]
    t0 = time.perf_counter()
    plan(x=part)
    first_own = time.perf_counter() - t0

    def pad():
        buf = np.empty_like(x)
        buf[:last] = part
        buf[last:] = part[-1]  # edge padding: finite values, independent items
        return plan(x=buf)["y"][:last]

    np.testing.assert_allclose(pad(), plan(x=part)["y"], rtol=1e-5, atol=1e-5)
    own = timed(lambda: plan(x=part), repeat)
    padded = timed(pad, repeat)
    row = {
        "model": model,
        "full": full,
        "last": last,
        "own_plan_first_call_s": first_own,
        "own_plan_cached_s": own,
        "padded_s": padded,
    }
    print(
        f"  last batch {model:9s} {last}/{full}: own plan first call {first_own * 1e3:.1f} ms, "
        f"cached {own * 1e3:.1f} ms; padded {padded * 1e3:.1f} ms",
        flush=True,
    )
    return row


def bench_device_overlap(
    backend: str, n_batches: int = 40, batch: int = 4096, max_depth: int = 64
) -> dict:
    """How much of the host-to-device copy time the pipeline hides behind compute.

    Overlap can hide at most the shorter of the two, so the workload is an MLP deep enough that
    computing a batch takes at least as long as staging it (the depth is calibrated on this
    card and reported). The serial copy time runs exactly the pipeline's loader path: the batch
    check, the pageable-to-pinned copy and the asynchronous host-to-device copy on the copy
    stream, waited for batch by batch.

    hidden = (copies alone + compute alone - pipelined run) / min(copies alone, compute alone).
    """
    from tensorlogic.pipeline.staging import check_batch, make_stager

    host = [make_inputs("mlp", batch) for _ in range(4)]
    batches = [host[k % 4] for k in range(n_batches)]

    def measure(depth: int) -> tuple:
        plan = tl.compile(mlp_graph(depth=depth), backend=backend, opt_level=2)
        be = plan.backend
        dev = [{"x": be.to_device(h["x"])} for h in host]
        stager = make_stager(be)

        def compute():
            for k in range(n_batches):
                plan(dev[k % 4])
            be.synchronize()

        def copies():
            for b in batches:
                stager.stage(check_batch(b, False), None).wait()

        def pipelined():
            for _ in tl.run_batches(plan, batches, progress=False):
                pass
            be.synchronize()

        return tuple(timed(f, 3) for f in (compute, copies, pipelined))

    depth = DEPTH
    t_compute, t_copy, t_pipe = measure(depth)
    # compute per layer is about linear in depth: deepen until compute >= 1.25 x copies
    while t_compute < 1.25 * t_copy and depth < max_depth:
        depth = min(max_depth, max(2 * depth, int(depth * 1.25 * t_copy / t_compute) + 1))
        t_compute, t_copy, t_pipe = measure(depth)
    hidden = (t_compute + t_copy - t_pipe) / min(t_copy, t_compute)
    row = {
        "backend": backend,
        "batches": n_batches,
        "batch": batch,
        "depth": depth,
        "compute_s": t_compute,
        "copy_s": t_copy,
        "pipelined_s": t_pipe,
        "copy_hidden": hidden,
        "target_met": hidden >= 0.8,
    }
    print(
        f"  device overlap ({backend}, MLP depth {depth}, {n_batches} batches of {batch}): "
        f"compute {t_compute * 1e3:.1f} ms, copies {t_copy * 1e3:.1f} ms (pinned staging "
        f"path), pipelined {t_pipe * 1e3:.1f} ms, serial sum {(t_compute + t_copy) * 1e3:.1f} "
        f"ms -> {hidden:.0%} of min(copy, compute) hidden (target >= 80%: "
        f"{'met' if hidden >= 0.8 else 'NOT met'})",
        flush=True,
    )
    return row


def gelu_mlp(width: int = 4096, depth: int = 8, seed: int = 0) -> tl.EinsumGraph:
    """x[B, width] -> depth x gelu(x W + b) -> y[B, width]."""
    rng = np.random.default_rng(seed)
    g = tl.EinsumGraph()
    h = g.input("x", shape=("B", width))
    for k in range(depth):
        w = g.constant(
            (rng.standard_normal((width, width)) * width**-0.5).astype(np.float32), name=f"w{k}"
        )
        b = g.constant((rng.standard_normal(width) * 0.1).astype(np.float32), name=f"b{k}")
        h = g.gelu(g.einsum("bi,ij->bj", h, w) + b)
    g.output(h, name="y")
    return g


def reference_rows(graph: tl.EinsumGraph, x: np.ndarray) -> np.ndarray:
    """The graph on a few rows, in float64 on the host (the accuracy reference)."""
    plan = tl.compile(graph, backend="numpy", opt_level=0)
    return plan(x=x)["y"].astype(np.float64)


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm(got - ref) / np.linalg.norm(ref))


def _save(name: str, rows: list[dict], extra: dict, copy_to: str | None) -> None:
    path = write_results(name, rows, extra, peers=("dask", "distributed", "cupy", "zarr"))
    if copy_to:
        import shutil

        shutil.copy(path, copy_to)


def _row(rows: list[dict], mode: str, seconds: float, n: int, base: float | None, **info) -> None:
    row = {
        "mode": mode,
        "seconds": seconds,
        "items_per_s": n / seconds,
        "vs_one_device": None if base is None else base / seconds,
        **info,
    }
    rows.append(row)
    ratio = "" if base is None else f"  {base / seconds:.2f}x one device"
    print(f"  {mode:58s} {seconds * 1e3:9.1f} ms {n / seconds:12.0f} rows/s{ratio}", flush=True)


def bench_multi_gpu(
    backend: str,
    width: int,
    depth: int,
    n: int,
    batch: int,
    repeat: int,
    devices: list[int],
    dask_gpus: bool,
    copy_to: str | None,
    in_process: bool = True,
) -> None:
    """One GPU vs several: in-process (devices=) and Dask (one worker per GPU)."""
    graph = gelu_mlp(width, depth)
    plan = tl.compile(graph, backend=backend)
    x = np.random.default_rng(1).standard_normal((n, width), dtype=np.float32)
    probe = np.r_[0:32, n - 32 : n]  # rows checked against the float64 host reference
    ref = reference_rows(graph, x[probe])
    rows: list[dict] = []
    extra: dict = {
        "model": f"{depth}-layer GELU MLP width {width}",
        "n_rows": n,
        "batch": batch,
        "backend": backend,
        "devices": devices,
    }

    def check(out: np.ndarray, what: str) -> float:
        err = rel_err(out[probe], ref)
        assert err < 1e-3, f"{what}: relative error {err:.2e}"
        return err

    # GPU compute alone (batches already on the device): the floor of any pipeline
    be = plan.backend
    dev = [be.to_device(x[i : i + batch]) for i in range(0, min(n, 2 * batch), batch)]

    def compute_only():
        for k in range(0, n, batch):
            plan(x=dev[(k // batch) % len(dev)])
        be.synchronize()

    # an in-process run takes 0.1-0.2 s and the host's copies have hiccups: a median of 7
    repeat_in = repeat if repeat == 1 else 7
    extra["in_process_repeats"] = repeat_in
    t_compute = timed(compute_only, repeat_in)
    one = timed(lambda: tl.run_batched(plan, {"x": x}, batch, progress=False), repeat_in)
    err = check(tl.run_batched(plan, {"x": x}, batch, progress=False)["y"], "one GPU")
    _row(rows, "GPU compute only, batches on the device (1 GPU)", t_compute, n, None)
    _row(rows, "in-process, 1 GPU (devices=None)", one, n, one, rel_err=err)
    if in_process:
        lane = timed(
            lambda: tl.run_batched(plan, {"x": x}, batch, devices=devices[:1], progress=False),
            repeat_in,
        )
        err = check(
            tl.run_batched(plan, {"x": x}, batch, devices=devices[:1], progress=False)["y"],
            "devices=[0]",
        )
        _row(rows, f"in-process, devices={devices[:1]}", lane, n, one, rel_err=err)
        base = min(one, lane)
        multi = timed(
            lambda: tl.run_batched(plan, {"x": x}, batch, devices=devices, progress=False),
            repeat_in,
        )
        err = check(
            tl.run_batched(plan, {"x": x}, batch, devices=devices, progress=False)["y"], "devices"
        )
        _row(rows, f"in-process, devices={devices}", multi, n, base, rel_err=err)
        # where the time goes: one traced run per lane count, summed up per lane
        extra["lane_timelines"] = {}
        for devs in (devices[:1], devices):
            with trace_lanes() as tr:
                t0 = time.perf_counter()
                tl.run_batched(plan, {"x": x}, batch, devices=devs, progress=False)
                wall = time.perf_counter() - t0
            print(
                f"  traced run devices={devs}: {wall * 1e3:.1f} ms\n    "
                + tr.report().replace("\n", "\n    ")
            )
            extra["lane_timelines"][str(devs)] = {"wall_s": wall, "lanes": tr.lanes()}
        extra["in_process_speedup"] = base / multi
        extra["in_process_target_met"] = base / multi >= 1.8
        print(
            f"  in-process {len(devices)} GPUs vs the best 1-GPU row: {base / multi:.2f}x "
            f"(target >= 1.8: {'met' if base / multi >= 1.8 else 'NOT met'})",
            flush=True,
        )
        _save("bench_pipeline_multigpu", rows, extra, copy_to)
        extra["other_shapes"] = other_shapes(backend, n, devices, repeat_in)
        _save("bench_pipeline_multigpu", rows, extra, copy_to)
    if dask_gpus:
        bench_dask_gpus(plan, graph, x, batch, repeat, len(devices), one, rows, extra, copy_to)


def other_shapes(backend: str, n: int, devices: list[int], repeat: int) -> list[dict]:
    """The same comparison (best one-GPU path vs all devices) on other widths and batch sizes."""
    out = []
    print("  other shapes (one GPU vs devices, in process):")
    for width, depth, batch in ((4096, 8, 2048), (4096, 8, 8192), (2048, 8, 4096)):
        plan = tl.compile(gelu_mlp(width, depth), backend=backend)
        x = np.random.default_rng(3).standard_normal((n, width), dtype=np.float32)
        one = timed(lambda: tl.run_batched(plan, {"x": x}, batch, progress=False), repeat)
        multi = timed(
            lambda: tl.run_batched(plan, {"x": x}, batch, devices=devices, progress=False),
            repeat,
        )
        row = {
            "model": f"{depth}-layer GELU MLP width {width}",
            "batch": batch,
            "one_gpu_s": one,
            "devices_s": multi,
            "speedup": one / multi,
        }
        out.append(row)
        print(
            f"    {row['model']}, batch {batch}: one GPU {one * 1e3:.1f} ms, "
            f"devices={devices} {multi * 1e3:.1f} ms = {one / multi:.2f}x",
            flush=True,
        )
    return out


def bench_dask_gpus(plan, graph, x, batch, repeat, gpus_max, one, rows, extra, copy_to) -> None:
    """One GPU worker vs ``gpus_max`` (tl.local_cluster): dask-array input generated and
    persisted on the workers, output persisted there; and numpy input through the client."""
    import dask.array as da
    from distributed import Client, wait

    n, width = x.shape
    probe = np.r_[0:32, n - 32 : n]
    ref = reference_rows(graph, x[probe])
    per_worker: dict[int, float] = {}
    for gpus in (1, gpus_max):
        with tl.local_cluster(gpus=gpus) as cluster, Client(cluster) as client:
            client.wait_for_workers(gpus, timeout=120)
            xd = da.random.default_rng(2).standard_normal(
                (n, width), chunks=(batch, width), dtype=np.float32
            )
            xd = client.persist(xd)  # generated on the workers; the client never holds it
            wait(xd)
            spread = sorted(collections_count(client.who_has(xd)).values())

            def run_persist(keep=False):
                return persist_run(client, plan, xd, keep)

            t0 = time.perf_counter()
            y = run_persist(keep=True)  # warm-up: ships and compiles the plan on every worker
            first = time.perf_counter() - t0
            err = rel_err(y[:32].compute(), reference_rows(graph, xd[:32].compute()))
            assert err < 1e-3, f"dask {gpus} GPU workers: relative error {err:.2e}"
            del y
            # its warm-up run releases the kept result; 5 rounds at least, since one run
            # of the cluster varies by 10-20% (scheduling, page faults in fresh chunks)
            t = timed(run_persist, max(repeat, 5))
            per_worker[gpus] = t
            _row(
                rows,
                f"dask {gpus} GPU worker(s), dask array in, persisted out",
                t,
                n,
                per_worker[1],
                rel_err=err,
                first_call_s=first,
                chunks_per_worker=spread,
            )
            if gpus > 1:
                small = {"x": x[:batch]}
                tl.run_batched(plan, small, batch, client=client, progress=False)  # warm-up
                t0 = time.perf_counter()
                got = tl.run_batched(plan, {"x": x}, batch, client=client, progress=False)
                t = time.perf_counter() - t0
                err = rel_err(got["y"][probe], ref)
                assert err < 1e-3, f"dask numpy through the client: relative error {err:.2e}"
                _row(
                    rows,
                    f"dask {gpus} GPU workers, numpy in/out through the client",
                    t,
                    n,
                    one,
                    rel_err=err,
                )
        _save("bench_pipeline_dask_gpu", rows, extra, copy_to)
    ratio = per_worker[1] / per_worker[gpus_max]
    extra["dask_speedup"] = ratio
    extra["dask_target_met"] = ratio >= 1.7
    print(
        f"  dask {gpus_max} GPU workers vs 1 worker: {ratio:.2f}x (target >= 1.7: "
        f"{'met' if ratio >= 1.7 else 'NOT met'})",
        flush=True,
    )
    _save("bench_pipeline_dask_gpu", rows, extra, copy_to)


def collections_count(who_has: dict) -> dict[str, int]:
    """Chunks held per worker."""
    count: dict[str, int] = {}
    for workers in who_has.values():
        for w in workers:
            count[w] = count.get(w, 0) + 1
    return count


def bench_cpu_cluster(
    width: int,
    depth: int,
    n: int,
    batch: int,
    repeat: int,
    layouts: list[tuple[int, int]],
    copy_to: str | None,
) -> None:
    """A CPU LocalCluster (workers x threads, dask-array input on the workers) vs one process
    (run_batched with BLAS on every core), numpy backend."""
    import dask.array as da
    from distributed import Client, wait

    graph = gelu_mlp(width, depth)
    plan = tl.compile(graph, backend="numpy")
    x = np.random.default_rng(1).standard_normal((n, width), dtype=np.float32)
    ref = reference_rows(graph, x[:32])
    cores = machine()["cores_usable"]
    rows: list[dict] = []
    one = timed(lambda: tl.run_batched(plan, {"x": x}, batch, progress=False), repeat)
    err = rel_err(tl.run_batched(plan, {"x": x[:batch]}, batch, progress=False)["y"][:32], ref)
    _row(rows, f"one process, BLAS on {cores} cores", one, n, one, rel_err=err)
    for workers, threads in layouts:
        with (
            tl.local_cluster(n_workers=workers, threads_per_worker=threads) as cluster,
            Client(cluster) as client,
        ):
            client.wait_for_workers(workers, timeout=120)
            xd = client.persist(
                da.random.default_rng(2).standard_normal(
                    (n, width), chunks=(batch, width), dtype=np.float32
                )
            )
            wait(xd)

            def run_persist(keep=False):
                return persist_run(client, plan, xd, keep)

            y = run_persist(keep=True)
            err = rel_err(y[:32].compute(), reference_rows(graph, xd[:32].compute()))
            del y
            t = timed(run_persist, repeat)  # its warm-up run releases the kept result
            _row(
                rows,
                f"LocalCluster {workers} workers x {threads} threads, dask array",
                t,
                n,
                one,
                rel_err=err,
            )
        _save(
            "bench_pipeline_cluster_cpu",
            rows,
            {
                "model": f"{depth}-layer GELU MLP width {width}",
                "n_rows": n,
                "batch": batch,
                "cores": cores,
            },
            copy_to,
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--quick", action="store_true", help="10,000 items, fewer repeats")
    ap.add_argument("--no-dask", action="store_true", help="skip the Dask LocalCluster runs")
    ap.add_argument(
        "--device-backend",
        help="measure copy/compute overlap on this GPU backend (default: cupy when it is usable)",
    )
    ap.add_argument("--multi-gpu", action="store_true", help="only the one-vs-several-GPU rows")
    ap.add_argument("--no-dask-gpu", action="store_true", help="with --multi-gpu: skip Dask")
    ap.add_argument(
        "--no-in-process",
        action="store_true",
        help="with --multi-gpu: only the one-GPU baseline and the Dask rows",
    )
    ap.add_argument(
        "--cpu-cluster", action="store_true", help="only the CPU LocalCluster vs one process rows"
    )
    ap.add_argument("--copy-to", help="also copy each result file into this folder")
    ap.add_argument("--rows", type=int, default=32768, help="rows of the scale-out runs")
    args = ap.parse_args()
    if args.multi_gpu or args.cpu_cluster:
        if args.multi_gpu:
            import cupy

            ids = list(range(cupy.cuda.runtime.getDeviceCount()))
            bench_multi_gpu(
                args.device_backend or "cupy",
                4096,
                8,
                args.rows,
                4096,
                1 if args.quick else 3,
                ids,
                not args.no_dask_gpu,
                args.copy_to,
                in_process=not args.no_in_process,
            )
        if args.cpu_cluster:
            cores = machine()["cores_usable"]
            layouts = [(cores, 1), (max(1, cores // 4), 4)]
            bench_cpu_cluster(
                1024, 4, args.rows, 4096, 1 if args.quick else 3, layouts, args.copy_to
            )
        return
    n = 10_000 if args.quick else 100_000
    repeat = 1 if args.quick else 3
    batches = [256, 4096]
    if not cores_look_free():
        print(
            f"note: the machine is busy (load {machine()['loadavg_1min']:.1f}); timings are noisy"
        )
    client = cluster = None
    if not args.no_dask:
        from distributed import Client, LocalCluster

        cluster = LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        )
        client = Client(cluster)
    rows = []
    try:
        for model in ("mlp", "attention"):
            rows += bench_model(model, n, batches, repeat, client)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    last = [bench_last_batch(m, 4096, 100_000 % 4096, max(3, repeat)) for m in ("mlp", "attention")]
    device = args.device_backend or ("cupy" if "cupy" in tl.available_backends() else None)
    overlap = bench_device_overlap(device) if device else None
    print()
    print(table(rows, ["model", "mode", "batch", "items_per_s", "vs_big"]))
    target = [r for r in rows if r["mode"] == "run_batched threads=1" and r["batch"] == 4096]
    met = all(r["vs_big"] >= 0.9 for r in target)
    ratios = ", ".join(f"{r['model']} {r['vs_big']:.2f}" for r in target)
    print(
        f"\ntarget run_batched (threads=1) >= 90% of one big call at batch 4096: "
        f"{'met' if met else 'NOT met'} ({ratios})"
    )
    path = write_results(
        "bench_pipeline",
        rows,
        {"items": n, "last_batch": last, "device_overlap": overlap, "target_met": met},
        peers=("dask", "distributed", "cupy"),
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
