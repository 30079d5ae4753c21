"""Whole models on the CPU: tensorlogic against torch (eager, SDPA, torch.compile) and onnxruntime.

Models (benchmarks/_models.py): the transformer encoder block (B=4 S=256 D=256 H=4, the same
with a causal additive mask, B=2 S=512 D=512 H=8), a 4-layer MLP (batch 256, width 1024), and the
examples/ programs with a torch equivalent (attention.tl, mlp.tl, kernel_machine.tl) at
realistic sizes. Every contender runs in its own process (no library's idle threads slow
another) and saves its outputs. The processes stay up and are sampled in turn: each round
takes one sample (the call looped for at least ``--min-time`` seconds) of every contender on
every model, with ``--gap`` seconds of quiet after each, so a slow minute on a shared machine
slows every contender alike; the median of ``--rounds`` rounds is reported. The parent checks
every output against a float64 numpy reference and against torch eager (float32 tolerance) and
prints ms, ratios and threads.

Ratios are peer time / ours: above 1 we are faster. Missing peers (torch, onnxruntime: the
``peers`` extra) are reported as missing, the rest still runs.

Contenders of ours are "BACKEND O<level> [option=value ...]" (compile options, e.g.
"numpy O2 threads=blas" or "auto O3 autotune_budget=3"); an option in capitals is an environment
variable of that contender's process (e.g. "numba O2 GOMP_SPINCOUNT=100000").

Usage: python benchmarks/bench_models.py [--quick] [--rounds N] [--contenders a,b,...]
       [--models i,j,...] [--name NAME] [--keep DIR] [--gap SECONDS]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _common import _sample, machine, table, write_results  # noqa: E402

OURS = (
    "numpy O0",
    "numpy O2",
    "numba O0",
    "numba O2",
    "auto O2",
    "auto O3",
    "numpy O2 threads=blas",
    "numba O2 threads=blas",
)
PEERS = ("torch eager", "torch SDPA", "torch.compile", "onnxruntime")
DEFAULT = (
    "numpy O0",
    "numpy O2",
    "numba O0",
    "numba O2",
    "auto O2",
    "auto O3",
    "numpy O2 threads=blas",
    "numba O2 threads=blas",
    *PEERS,
)
RTOL = 2e-4  # float32 outputs: max abs error over max abs value of the reference


def _models():
    import _models

    return _models.all_models()


# ------------------------------------------------------------------ worker side
def _value(text: str):
    """A contender's option value: True, False, None, a number where it reads as one, else
    the text."""
    if text in ("True", "False", "None"):
        return {"True": True, "False": False, "None": None}[text]
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _is_env(key: str) -> bool:
    """Whether a contender's ``key=value`` is an environment variable (capitals) rather than a
    compile option."""
    return key.isupper()


def _environment(name: str) -> dict[str, str]:
    """The process environment of a contender: ours plus its capitalized ``KEY=value`` parts."""
    extra = dict(p.split("=", 1) for p in name.split()[2:] if "=" in p)
    return {**os.environ, **{k: v for k, v in extra.items() if _is_env(k)}}


def _ours(name: str, model, arrays):
    import tensorlogic as tl
    from tensorlogic.backends.numpy import host_pool

    parts = name.split()
    backend, level = parts[0], int(parts[1][1:])
    opts = {k: _value(v) for k, v in (p.split("=", 1) for p in parts[2:]) if not _is_env(k)}
    plan = tl.compile(model.graph(arrays), backend=backend, opt_level=level, **opts)
    feed = {k: arrays[k] for k in model.inputs}

    def call():
        return plan(**feed)

    threads = host_pool.helper_count() + 1
    if plan.backend.name == "numba":
        import numba

        threads = max(threads, numba.get_num_threads())
    return (
        call,
        (lambda res: [res[o] for o in model.outputs]),
        threads,
        f"{plan.backend.name} O{level}",
        plan,
    )


def _torch(name: str, model, arrays, tmp: Path, idx: int):
    import torch

    torch.set_grad_enabled(False)
    fn = model.torch_fn(arrays, name == "torch SDPA")
    feed = [torch.from_numpy(arrays[k]) for k in model.inputs]
    if name == "torch.compile":
        fn = torch.compile(fn, dynamic=False)
    return (
        (lambda: fn(*feed)),
        (lambda res: [r.numpy() for r in res]),
        torch.get_num_threads(),
        None,
        None,
    )


def _export_onnx(model, arrays, path: Path) -> str | None:
    """Export the torch version of a model to ONNX; the reason on failure."""
    try:
        import torch
    except ImportError:
        return "torch missing (needed to export the model)"

    fn = model.torch_fn(arrays, False)

    class Wrap(torch.nn.Module):
        def forward(self, *xs):
            return fn(*xs)

    feed = tuple(torch.from_numpy(arrays[k]) for k in model.inputs)
    try:
        torch.onnx.export(
            Wrap(),
            feed,
            str(path),
            input_names=list(model.inputs),
            output_names=list(model.outputs),
            dynamo=False,
        )
    except Exception as exc:  # noqa: BLE001 - any export failure: the peer is reported absent
        return f"not exportable: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return None


def _onnxruntime(model, arrays, path: Path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {k: arrays[k] for k in model.inputs}
    threads = sess.get_session_options().intra_op_num_threads or os.cpu_count()
    return (lambda: sess.run(None, feed)), (lambda res: list(res)), threads, None, None


def _setup(name: str, i: int, model, tmp: Path):
    """(call, row) of one contender on one model: the call is None where it cannot run."""
    arrays = model.arrays()
    row: dict = {}
    try:
        t0 = time.perf_counter()
        if name in PEERS and name != "onnxruntime":
            if name == "torch SDPA" and not model.sdpa:
                return None, {"error": "no attention in this model"}
            call, outs, threads, resolved, plan = _torch(name, model, arrays, tmp, i)
        elif name == "onnxruntime":
            path = tmp / f"model{i}.onnx"
            if not path.exists():
                return None, {"error": "no ONNX export of this model"}
            call, outs, threads, resolved, plan = _onnxruntime(model, arrays, path)
        else:
            call, outs, threads, resolved, plan = _ours(name, model, arrays)
        res = outs(call())
        for _ in range(3):  # warm-up
            call()
        row["setup_s"] = time.perf_counter() - t0
        row["threads"] = threads
        if resolved:
            row["resolved"] = resolved
        if plan is not None and plan.concrete.autotune is not None:
            row["autotune"] = str(plan.concrete.autotune)
        np.savez(tmp / f"{name.replace(' ', '_')}-{i}.npz", *[np.asarray(r) for r in res])
        return call, row
    except ImportError as exc:
        return None, {"error": f"missing: {exc.name} (pip install tensorlogic[peers])"}
    except Exception as exc:  # noqa: BLE001 - a failing contender is reported, not fatal
        return None, {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}


def worker(name: str, indices: list[int], tmp: Path) -> None:
    """Serve one contender: set up every model, print one JSON line of setup rows, then answer
    ``sample <model index> <min_time>`` lines with the seconds per call (one line each) until
    ``quit``. The parent asks the contenders in turn (round-robin), so a slow minute on a
    shared machine slows every contender alike."""
    models = _models()
    if name == "onnx export":
        report = {}
        for i in indices:
            err = _export_onnx(models[i], models[i].arrays(), tmp / f"model{i}.onnx")
            report[models[i].name] = {"error": err} if err else {"exported": True}
        print(json.dumps(report), flush=True)
        return
    calls, report = {}, {}
    for i in indices:
        call, row = _setup(name, i, models[i], tmp)
        report[models[i].name] = row
        if call is not None:
            calls[i] = call
    print(json.dumps(report), flush=True)
    for line in sys.stdin:
        parts = line.split()
        if not parts or parts[0] == "quit":
            return
        i, min_time = int(parts[1]), float(parts[2])
        print(_sample(calls[i], min_time) if i in calls else "nan", flush=True)


# ------------------------------------------------------------------ parent side
class _Worker:
    """A contender's serving process (``worker``)."""

    def __init__(self, name: str, indices: list[int], tmp: Path) -> None:
        cmd = [
            sys.executable,
            __file__,
            "--worker",
            name,
            "--models",
            ",".join(map(str, indices)),
            "--tmp",
            str(tmp),
        ]
        self.name = name
        self.proc = subprocess.Popen(
            cmd,
            cwd=HERE,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=_environment(name),
        )
        line = self.proc.stdout.readline()
        try:
            self.report = json.loads(line)
        except json.JSONDecodeError:
            self.report = {"__failed__": f"worker exited with status {self.proc.wait()}"}

    def sample(self, i: int, min_time: float) -> float:
        self.proc.stdin.write(f"sample {i} {min_time}\n")
        self.proc.stdin.flush()
        return float(self.proc.stdout.readline() or "nan")

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write("quit\n")
                self.proc.stdin.close()
            except OSError:
                pass
            self.proc.wait()


def _run_round_robin(names, models, indices, args, tmp: Path) -> dict:
    """Every contender's rows: each in its own process, sampled in turn, ``--gap`` seconds of
    quiet between samples (so one library's spinning threads have stopped before the next)."""
    workers = []
    for name in names:  # one at a time: setups (compiles) do not compete
        print(f"== {name}: setting up", flush=True)
        w = _Worker(name, indices, tmp)
        workers.append(w)
        for m, row in w.report.items():
            if isinstance(row, dict) and row.get("error"):
                print(f"  {name:24s} {m:40s} {row['error']}", flush=True)
    results = {w.name: w.report for w in workers}
    live = [w for w in workers if "__failed__" not in w.report]
    times: dict[tuple[str, int], list[float]] = {}
    for r in range(args.rounds):
        for i in indices:
            order = live[r % len(live) :] + live[: r % len(live)] if live else []
            for w in order:
                if "error" in w.report.get(models[i].name, {}):
                    continue
                times.setdefault((w.name, i), []).append(w.sample(i, args.min_time))
                if args.gap:
                    time.sleep(args.gap)
        print(f"round {r + 1}/{args.rounds} done", flush=True)
    for w in workers:
        w.close()
    for (name, i), ts in times.items():
        row = results[name][models[i].name]
        row.update(ms=statistics.median(ts) * 1e3, rounds_ms=[t * 1e3 for t in ts])
    return results


def _load(tmp: Path, name: str, i: int):
    path = tmp / f"{name.replace(' ', '_')}-{i}.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        return [z[f"arr_{k}"] for k in range(len(z.files))]


def _rel_err(got, want) -> float:
    return max(
        float(np.max(np.abs(np.asarray(g, np.float64) - w)) / (np.max(np.abs(w)) + 1e-30))
        for g, w in zip(got, want)
    )


def _rows(models, indices, names, results, missing, tmp: Path, refs) -> list[dict]:
    """One row per model and contender: times, ratios to the peers, output checks."""
    rows = []
    for i in indices:
        model = models[i]
        ref = refs[i]
        torch_out = _load(tmp, "torch eager", i)
        base = {p: results.get(p, {}).get(model.name, {}).get("ms") for p in PEERS}
        for name in names:
            r = results.get(name, {}).get(model.name)
            if r is None:
                why = (
                    missing.get("torch")
                    if name.startswith("torch")
                    else missing.get("onnxruntime") or missing.get("torch")
                )
                if why:
                    rows.append(
                        {"model": model.name, "contender": name, "error": f"peer missing: {why}"}
                    )
                continue
            row = {
                "model": model.name,
                "contender": name,
                **{k: v for k, v in r.items() if k != "rounds_ms"},
                "rounds_ms": r.get("rounds_ms"),
            }
            got = _load(tmp, name, i)
            if got is not None:
                row["err_vs_ref"] = _rel_err(got, ref)
                if torch_out is not None:
                    row["err_vs_torch"] = _rel_err(got, [t.astype(np.float64) for t in torch_out])
                row["ok"] = bool(row["err_vs_ref"] <= RTOL and row.get("err_vs_torch", 0.0) <= RTOL)
            if "ms" in r:
                for p, label in (
                    ("torch eager", "vs_eager"),
                    ("torch.compile", "vs_compile"),
                    ("torch SDPA", "vs_sdpa"),
                    ("onnxruntime", "vs_ort"),
                ):
                    if base.get(p):
                        row[label] = base[p] / r["ms"]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 0.05 s (smoke run)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.25)
    ap.add_argument(
        "--gap",
        type=float,
        default=0.1,
        help="seconds of quiet after each sample (idle threads of the last "
        "contender stop spinning)",
    )
    ap.add_argument("--contenders", default=",".join(DEFAULT))
    ap.add_argument("--models", default=None, help="indices into the model list")
    ap.add_argument("--name", default="bench_models", help="results/<name>.json")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--keep", default=None, help="keep each contender's raw timings and outputs in this folder"
    )
    args = ap.parse_args(argv)
    models = _models()
    indices = [int(i) for i in args.models.split(",")] if args.models else list(range(len(models)))
    if args.worker:
        worker(args.worker, indices, Path(args.tmp))
        return 0
    if args.quick:
        args.rounds, args.min_time = 3, 0.05
    names = [c.strip() for c in args.contenders.split(",") if c.strip()]
    unknown = [c for c in names if c not in PEERS and " ".join(c.split()[:2]) not in OURS]
    if unknown:
        ap.error(f"unknown contenders {unknown}; known: {OURS + PEERS}")
    missing = {}
    for mod, peer in (("torch", "torch"), ("onnxruntime", "onnxruntime")):
        try:
            __import__(mod)
        except ImportError:
            missing[peer] = "not installed (pip install 'tensorlogic[peers]')"
    for peer, why in missing.items():
        print(f"peer {peer}: {why}; its rows are skipped")
    m0 = machine()
    print(
        f"machine: {m0['cpu']}, {m0['cores_usable']} cores, load {m0['loadavg_1min']:.2f}",
        flush=True,
    )
    results: dict[str, dict] = {}
    refs = {}
    for i in indices:
        model = models[i]
        refs[i] = [model.reference(model.arrays())[o] for o in model.outputs]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        run = [
            n
            for n in names
            if not (n.startswith("torch") and "torch" in missing or n == "onnxruntime" and missing)
        ]
        if "onnxruntime" in run:  # export the torch models first, in a process of its own
            export = _Worker("onnx export", indices, tmp)
            export.close()
            results["onnx export"] = export.report
        results.update(_run_round_robin(run, models, indices, args, tmp))
        rows = _rows(models, indices, names, results, missing, tmp, refs)
    cols = [
        "model",
        "contender",
        "ms",
        "vs_eager",
        "vs_compile",
        "vs_sdpa",
        "vs_ort",
        "threads",
        "ok",
        "err_vs_ref",
        "error",
    ]
    print(table(rows, cols))
    m1 = machine()
    extra = {
        "load_before": m0["loadavg_1min"],
        "load_after": m1["loadavg_1min"],
        "rounds": args.rounds,
        "min_time_s": args.min_time,
        "rtol": RTOL,
        "peers_missing": missing,
        "env": {
            k: os.environ[k]
            for k in (
                "CUDA_VISIBLE_DEVICES",
                "TL_NUM_THREADS",
                "OMP_NUM_THREADS",
                "OMP_WAIT_POLICY",
                "GOMP_SPINCOUNT",
            )
            if k in os.environ
        },
        "gap_s": args.gap,
    }
    path = write_results(args.name, rows, extra, peers=("torch", "onnxruntime", "threadpoolctl"))
    print(f"load {m0['loadavg_1min']:.2f} -> {m1['loadavg_1min']:.2f}; wrote {path}")
    bad = [r for r in rows if r.get("ok") is False]
    for r in bad:
        print(f"MISMATCH: {r['model']} / {r['contender']}: err {r['err_vs_ref']:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
