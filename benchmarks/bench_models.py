"""Whole models on the CPU: tensorlogic against torch (eager, SDPA, torch.compile) and onnxruntime.

Models (benchmarks/_models.py): the transformer encoder block (B=4 S=256 D=256 H=4, the same
with a causal additive mask, B=2 S=512 D=512 H=8), a 4-layer MLP (batch 256, width 1024), and the
examples/ programs with a torch equivalent (attention.tl, mlp.tl, kernel_machine.tl) at
realistic sizes. Every contender runs in its own process (no library's idle threads slow
another), takes the median of ``--rounds`` rounds (each round loops the call for at least
``--min-time`` seconds) and saves its outputs; the parent checks every output against a float64
numpy reference and against torch eager (float32 tolerance) and prints ms, ratios and threads.

Ratios are peer time / ours: above 1 we are faster. Missing peers (torch, onnxruntime: the
``peers`` extra) are reported as missing, the rest still runs.

Contenders of ours are "BACKEND O<level> [option=value ...]" (compile options, e.g.
"numpy O2 threads=blas" or "auto O3 autotune_budget=3").

Usage: python benchmarks/bench_models.py [--quick] [--rounds N] [--contenders a,b,...]
       [--models i,j,...] [--name NAME] [--keep DIR]
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

OURS = ("numpy O0", "numpy O2", "numba O0", "numba O2", "auto O2", "auto O3",
        "numpy O2 threads=blas", "numba O2 threads=blas")
PEERS = ("torch eager", "torch SDPA", "torch.compile", "onnxruntime")
DEFAULT = ("numpy O0", "numpy O2", "numba O0", "numba O2", "auto O2", "auto O3",
           "numpy O2 threads=blas", "numba O2 threads=blas", *PEERS)
RTOL = 2e-4  # float32 outputs: max abs error over max abs value of the reference


def _models():
    import _models

    return _models.all_models()


# ------------------------------------------------------------------ worker side
def _time(fn, rounds: int, min_time: float) -> list[float]:
    """Seconds per call, one figure per round (each round loops fn for min_time seconds)."""
    for _ in range(3):
        fn()
    return [_sample(fn, min_time) for _ in range(rounds)]


def _value(text: str):
    """A contender's option value: a number where it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _ours(name: str, model, arrays):
    import tensorlogic as tl
    from tensorlogic.backends.numpy import host_pool

    parts = name.split()
    backend, level = parts[0], int(parts[1][1:])
    opts = {k: _value(v) for k, v in (p.split("=", 1) for p in parts[2:])}
    plan = tl.compile(model.graph(arrays), backend=backend, opt_level=level, **opts)
    feed = {k: arrays[k] for k in model.inputs}

    def call():
        return plan(**feed)
    threads = host_pool.helper_count() + 1
    if plan.backend.name == "numba":
        import numba

        threads = max(threads, numba.get_num_threads())
    return call, (lambda res: [res[o] for o in model.outputs]), threads, \
        f"{plan.backend.name} O{level}", plan


def _torch(name: str, model, arrays, tmp: Path, idx: int):
    import torch

    torch.set_grad_enabled(False)
    fn = model.torch_fn(arrays, name == "torch SDPA")
    feed = [torch.from_numpy(arrays[k]) for k in model.inputs]
    if name == "torch.compile":
        fn = torch.compile(fn, dynamic=False)
    return (lambda: fn(*feed)), (lambda res: [r.numpy() for r in res]), \
        torch.get_num_threads(), None, None


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
        torch.onnx.export(Wrap(), feed, str(path), input_names=list(model.inputs),
                          output_names=list(model.outputs), dynamo=False)
    except Exception as exc:  # noqa: BLE001 - any export failure: the peer is reported absent
        return f"not exportable: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
    return None


def _onnxruntime(model, arrays, path: Path):
    import onnxruntime as ort

    sess = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    feed = {k: arrays[k] for k in model.inputs}
    threads = sess.get_session_options().intra_op_num_threads or os.cpu_count()
    return (lambda: sess.run(None, feed)), (lambda res: list(res)), threads, None, None


def worker(name: str, indices: list[int], rounds: int, min_time: float, tmp: Path) -> None:
    """Time one contender on the given models; write tmp/<name>.json and the outputs."""
    models = _models()
    report: dict[str, dict] = {}
    for i in indices:
        model = models[i]
        arrays = model.arrays()
        row: dict = {}
        try:
            if name == "onnx export":
                err = _export_onnx(model, arrays, tmp / f"model{i}.onnx")
                report[model.name] = {"error": err} if err else {"exported": True}
                continue
            t0 = time.perf_counter()
            if name in PEERS and name != "onnxruntime":
                if name == "torch SDPA" and not model.sdpa:
                    report[model.name] = {"error": "no attention in this model"}
                    continue
                call, outs, threads, resolved, plan = _torch(name, model, arrays, tmp, i)
            elif name == "onnxruntime":
                path = tmp / f"model{i}.onnx"
                if not path.exists():
                    report[model.name] = {"error": "no ONNX export of this model"}
                    continue
                call, outs, threads, resolved, plan = _onnxruntime(model, arrays, path)
            else:
                call, outs, threads, resolved, plan = _ours(name, model, arrays)
            res = outs(call())
            row["setup_s"] = time.perf_counter() - t0
            times = _time(call, rounds, min_time)
            row.update(ms=statistics.median(times) * 1e3, rounds_ms=[t * 1e3 for t in times],
                       threads=threads)
            if resolved:
                row["resolved"] = resolved
            if plan is not None and plan.concrete.autotune is not None:
                row["autotune"] = str(plan.concrete.autotune)
            np.savez(tmp / f"{name.replace(' ', '_')}-{i}.npz", *[np.asarray(r) for r in res])
        except ImportError as exc:
            row = {"error": f"missing: {exc.name} (pip install tensorlogic[peers])"}
        except Exception as exc:  # noqa: BLE001 - a failing contender is reported, not fatal
            row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        report[model.name] = row
        print(f"  {name:24s} {model.name:40s} {row.get('ms', float('nan')):9.3f} ms "
              f"{row.get('error', '')}", flush=True)
    (tmp / f"{name.replace(' ', '_')}.json").write_text(json.dumps(report))


# ------------------------------------------------------------------ parent side
def _run_worker(name, indices, args, tmp: Path) -> dict:
    cmd = [sys.executable, __file__, "--worker", name, "--models", ",".join(map(str, indices)),
           "--rounds", str(args.rounds), "--min-time", str(args.min_time), "--tmp", str(tmp)]
    rc = subprocess.call(cmd, cwd=HERE)
    path = tmp / f"{name.replace(' ', '_')}.json"
    if rc or not path.exists():
        return {"__failed__": f"worker exited with status {rc}"}
    return json.loads(path.read_text())


def _load(tmp: Path, name: str, i: int):
    path = tmp / f"{name.replace(' ', '_')}-{i}.npz"
    if not path.exists():
        return None
    with np.load(path) as z:
        return [z[f"arr_{k}"] for k in range(len(z.files))]


def _rel_err(got, want) -> float:
    return max(float(np.max(np.abs(np.asarray(g, np.float64) - w)) / (np.max(np.abs(w)) + 1e-30))
               for g, w in zip(got, want))


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
                why = (missing.get("torch") if name.startswith("torch") else
                       missing.get("onnxruntime") or missing.get("torch"))
                if why:
                    rows.append({"model": model.name, "contender": name,
                                 "error": f"peer missing: {why}"})
                continue
            row = {"model": model.name, "contender": name, **{k: v for k, v in r.items()
                                                              if k != "rounds_ms"},
                   "rounds_ms": r.get("rounds_ms")}
            got = _load(tmp, name, i)
            if got is not None:
                row["err_vs_ref"] = _rel_err(got, ref)
                if torch_out is not None:
                    row["err_vs_torch"] = _rel_err(got, [t.astype(np.float64)
                                                         for t in torch_out])
                row["ok"] = bool(row["err_vs_ref"] <= RTOL and
                                 row.get("err_vs_torch", 0.0) <= RTOL)
            if "ms" in r:
                for p, label in (("torch eager", "vs_eager"), ("torch.compile", "vs_compile"),
                                 ("torch SDPA", "vs_sdpa"), ("onnxruntime", "vs_ort")):
                    if base.get(p):
                        row[label] = base[p] / r["ms"]
            rows.append(row)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 0.05 s (smoke run)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.25)
    ap.add_argument("--contenders", default=",".join(DEFAULT))
    ap.add_argument("--models", default=None, help="indices into the model list")
    ap.add_argument("--name", default="bench_models", help="results/<name>.json")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--keep", default=None,
                    help="keep each contender's raw timings and outputs in this folder")
    args = ap.parse_args(argv)
    models = _models()
    indices = [int(i) for i in args.models.split(",")] if args.models else list(range(len(models)))
    if args.worker:
        worker(args.worker, indices, args.rounds, args.min_time, Path(args.tmp))
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
    print(f"machine: {m0['cpu']}, {m0['cores_usable']} cores, load {m0['loadavg_1min']:.2f}",
          flush=True)
    results: dict[str, dict] = {}
    refs = {}
    for i in indices:
        model = models[i]
        refs[i] = [model.reference(model.arrays())[o] for o in model.outputs]
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(args.keep or d)
        tmp.mkdir(parents=True, exist_ok=True)
        for name in names:
            if name.startswith("torch") and "torch" in missing or \
                    name == "onnxruntime" and missing:
                continue
            if name == "onnxruntime":  # export the torch models first, in a process of its own
                results["onnx export"] = _run_worker("onnx export", indices, args, tmp)
            print(f"== {name}", flush=True)
            results[name] = _run_worker(name, indices, args, tmp)
            # partial results after every contender, so a run cut short still leaves its figures
            write_results(args.name, _rows(models, indices, names, results, missing, tmp, refs),
                          {"partial": True, "load_before": m0["loadavg_1min"]},
                          peers=("torch", "onnxruntime", "threadpoolctl"))
        rows = _rows(models, indices, names, results, missing, tmp, refs)
    cols = ["model", "contender", "ms", "vs_eager", "vs_compile", "vs_sdpa", "vs_ort", "threads",
            "ok", "err_vs_ref", "error"]
    print(table(rows, cols))
    m1 = machine()
    extra = {"load_before": m0["loadavg_1min"], "load_after": m1["loadavg_1min"],
             "rounds": args.rounds, "min_time_s": args.min_time, "rtol": RTOL,
             "peers_missing": missing,
             "env": {k: os.environ[k] for k in ("CUDA_VISIBLE_DEVICES", "TL_NUM_THREADS",
                                                "OMP_NUM_THREADS") if k in os.environ}}
    path = write_results(args.name, rows, extra, peers=("torch", "onnxruntime", "threadpoolctl"))
    print(f"load {m0['loadavg_1min']:.2f} -> {m1['loadavg_1min']:.2f}; wrote {path}")
    bad = [r for r in rows if r.get("ok") is False]
    for r in bad:
        print(f"MISMATCH: {r['model']} / {r['contender']}: err {r['err_vs_ref']:.2e}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
