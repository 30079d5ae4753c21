"""Training steps: forward + backward + Adam, tensorlogic against PyTorch eager and torch.compile.

Models (benchmarks/_models.py builders): the transformer encoder block (B=4 S=256 D=256 H=4) and
the 4-layer MLP (batch 256, width 1024) of bench_models, with a mean-squared-error loss against a
fixed random target; every weight is a parameter. Ours: ``tl.grad`` of the loss with respect to
every weight, compiled at O2, and ``tl.optim.Adam`` (fused in-place update kernels). Torch: the
same model written the way a PyTorch user would (``nn.Linear`` weight layout, fused QKV
projection), ``loss.backward()`` and ``torch.optim.Adam``; ``torch.compile`` compiles the forward
and loss (AOTAutograd makes the backward). Every contender runs in its own process, from the
same weights; the parent checks the first step's gradients of each against torch autograd and
prints medians and ratios (peer time / ours: above 1 we are faster).

CPU (default): float32. ``--device``: bf16 mixed precision on the current CUDA GPU (ours: the
cupy backend with ``precision="bf16"``, float32 parameters and Adam state; torch: ``autocast``
to bf16 with float32 parameters), device time per step and the peak device memory of each
process (ours: the CuPy pool's bytes, which keeps every block it ever held; torch: its
caching allocator's peak reserved and peak allocated bytes). On the GPU every model runs in a
process of its own, so each model's peak is its own (on the CPU a worker drops the last step,
tensorlogic's plan cache and cached blocks before the next model).

Also (CPU run): the examples/mlp_classifier.py task trained by ours and by torch with the same
hyperparameters, initial weights and batches; the test accuracy of both is recorded (the test
suite asserts ours against the torch figure stored here).

``--threads N`` runs every contender with N threads (OpenMP, BLAS, numba and tensorlogic's
pool): on a machine shared with other work, one thread each is the comparison least distorted
by threads that spin waiting for cores.

Usage: python benchmarks/bench_train.py [--quick] [--rounds N] [--contenders a,b] [--threads N]
       python benchmarks/bench_train.py --device --out DIR     (on a GPU machine)
Writes benchmarks/results/bench_train.json (or bench_train_gpu.json in --out for --device).
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
sys.path.insert(0, str(HERE.parent / "examples"))

from _common import _sample, machine, table, write_results  # noqa: E402

CPU_OURS = ("numpy O2", "numba O2")
CPU_PEERS = ("torch eager", "torch.compile")
GPU_OURS = ("cupy O2 bf16",)
GPU_PEERS = ("torch eager bf16", "torch.compile bf16")
LR = 1e-4
GRAD_RTOL = {"cpu": 2e-3, "gpu": 6e-2}  # max abs error over max abs torch gradient


def _models():
    import _models

    return [_models.block(4, 256, 256, 4), _models.mlp(256, 1024, 4)]


def _data(model):
    arrays = model.arrays()
    out = model.reference(arrays)["out"]
    rng = np.random.default_rng(7)
    target = rng.standard_normal(out.shape).astype(np.float32)
    weights = [k for k in arrays if k not in model.inputs]
    return arrays, target, weights


# ------------------------------------------------------------------ ours
def _ours(name: str, model, device: bool):
    import tensorlogic as tl

    arrays, target, weights = _data(model)
    parts = name.split()
    backend, level = parts[0], int(parts[1][1:])
    opts = {"precision": "bf16"} if "bf16" in parts else {}
    g = model.graph(arrays)
    out = g.tensor(g.outputs.pop("out"))
    diff = out - g.input("t", tuple(out.shape), "float32")
    g.output(g.mean(diff * diff), name="loss")
    tg = tl.grad(g.constants_as_parameters(weights), of="loss", wrt=weights)
    plan = tl.compile(tg, backend=backend, opt_level=level, **opts)
    be = plan.backend
    feed = {k: be.to_device(arrays[k]) for k in model.inputs}
    feed["t"] = be.to_device(target)
    first = plan(**feed)
    grads = {w: np.asarray(be.to_host(first[f"grad_{w}"]), np.float32) for w in weights}
    opt = tl.optim.Adam(lr=LR)

    def step():
        opt.step(plan, plan(**feed))

    sync = be.synchronize
    return step, sync, grads, plan


# ------------------------------------------------------------------ torch
def _torch_model(model, arrays, torch, dev):
    """Parameters in torch's layout, the forward function, and the map back to our names."""
    import torch.nn.functional as F

    def param(a):
        return torch.nn.Parameter(torch.from_numpy(np.ascontiguousarray(a)).to(dev))

    if model.name.startswith("block"):
        h, dk, d = arrays["wq"].shape
        p = {
            "wqkv": param(
                np.concatenate([arrays[w].reshape(h * dk, d) for w in ("wq", "wk", "wv")])
            ),
            "wo": param(arrays["wo"].reshape(h * dk, d)),
            "w1t": param(arrays["w1"].T),
            "w2t": param(arrays["w2"].T),
            **{k: param(arrays[k]) for k in ("b1", "b2", "g1", "be1", "g2", "be2")},
        }
        scale = 1.0 / np.sqrt(dk)

        def fwd(x):
            b, s, _ = x.shape
            qkv = F.linear(x, p["wqkv"]).view(b, s, 3, h, dk).permute(2, 0, 3, 1, 4)
            q, k, v = qkv[0], qkv[1], qkv[2]
            ctx = torch.softmax((q @ k.transpose(-1, -2)) * scale, dim=-1) @ v
            att = ctx.transpose(1, 2).reshape(b, s, h * dk) @ p["wo"]
            y = F.layer_norm(x + att, (d,), p["g1"], p["be1"])
            m = F.gelu(F.linear(y, p["w1t"], p["b1"]), approximate="tanh")
            return F.layer_norm(y + F.linear(m, p["w2t"], p["b2"]), (d,), p["g2"], p["be2"])

        def ours(gr):
            qkv = gr["wqkv"]
            n = h * dk
            out = {
                w: qkv[i * n : (i + 1) * n].reshape(h, dk, d)
                for i, w in enumerate(("wq", "wk", "wv"))
            }
            out["wo"] = gr["wo"].reshape(h, dk, d)
            out["w1"], out["w2"] = gr["w1t"].T, gr["w2t"].T
            out.update({k: gr[k] for k in ("b1", "b2", "g1", "be1", "g2", "be2")})
            return out
    else:
        n = sum(1 for k in arrays if k.startswith("w"))
        p = {}
        for i in range(n):
            p[f"w{i}t"] = param(arrays[f"w{i}"].T)
            p[f"b{i}"] = param(arrays[f"b{i}"])

        def fwd(x):
            for i in range(n):
                x = F.linear(x, p[f"w{i}t"], p[f"b{i}"])
                if i < n - 1:
                    x = F.relu(x)
            return x

        def ours(gr):
            return {
                **{f"w{i}": gr[f"w{i}t"].T for i in range(n)},
                **{f"b{i}": gr[f"b{i}"] for i in range(n)},
            }

    return p, fwd, ours


def _torch(name: str, model, device: bool):
    import torch

    dev = "cuda" if device else "cpu"
    arrays, target, weights = _data(model)
    params, fwd, to_ours = _torch_model(model, arrays, torch, dev)
    x = torch.from_numpy(arrays[model.inputs[0]]).to(dev)
    t = torch.from_numpy(target).to(dev)

    def loss_fn(x, t):
        return ((fwd(x) - t) ** 2).mean()

    if name.startswith("torch.compile"):
        loss_fn = torch.compile(loss_fn, dynamic=False)
    bf16 = "bf16" in name

    def loss():
        if bf16:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                return loss_fn(x, t)
        return loss_fn(x, t)

    loss().backward()
    grads = to_ours({k: v.grad.detach().float().cpu().numpy() for k, v in params.items()})
    opt = torch.optim.Adam(params.values(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=True)
        loss().backward()
        opt.step()

    sync = torch.cuda.synchronize if device else (lambda: None)
    return step, sync, grads, None


# ------------------------------------------------------------------ worker
def worker(
    name: str, indices: list[int], rounds: int, min_time: float, tmp: Path, device: bool
) -> None:
    """Time one contender's training step on the given models; write tmp/<name>.json."""
    models = _models()
    report: dict[str, dict] = {}
    for i in indices:
        model = models[i]
        row: dict = {}
        try:
            if device:
                _reset_peak(name)
            t0 = time.perf_counter()
            fn = _torch if name.startswith("torch") else _ours
            step, sync, grads, _ = fn(name, model, device)
            step()
            sync()
            row["setup_s"] = time.perf_counter() - t0

            def timed():
                step()
                sync()

            for _ in range(2):
                timed()
            times = [_sample(timed, min_time) for _ in range(rounds)]
            row.update(ms=statistics.median(times) * 1e3, rounds_ms=[t * 1e3 for t in times])
            if device:
                row.update(_peak(name))
            else:
                row["threads"] = _threads(name)
            np.savez(tmp / f"{_file(name)}-{i}.npz", **grads)
        except ImportError as exc:
            row = {"error": f"missing: {exc.name} (pip install tensorlogic[peers])"}
        except Exception as exc:  # noqa: BLE001 - a failing contender is reported, not fatal
            row = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"}
        report[model.name] = row
        # nothing of this model's step outlives it: the next model's peak is its own
        step = sync = timed = None  # noqa: F841
        _release(name)
        print(
            f"  {name:22s} {model.name:34s} {row.get('ms', float('nan')):9.3f} ms "
            f"{row.get('error', '')}",
            flush=True,
        )
    (tmp / f"{_file(name)}.json").write_text(json.dumps(report))


def _file(name: str) -> str:
    return name.replace(" ", "_")


def _threads(name: str) -> int:
    if name.startswith("torch"):
        import torch

        return torch.get_num_threads()
    from tensorlogic.backends.numpy import host_pool

    n = host_pool.helper_count() + 1
    if name.startswith("numba"):
        import numba

        n = max(n, numba.get_num_threads())
    return n


_USED0: list[int] = []


def _device_used() -> int:
    """Bytes in use on the device (every allocation of every library, this process included)."""
    import cupy

    free, total = cupy.cuda.runtime.memGetInfo()
    return total - free


def _release(name: str) -> None:
    """Free what the last model left behind (plans cached by tensorlogic, cached blocks)."""
    import gc

    gc.collect()
    if name.startswith("torch"):
        try:
            import torch

            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except ImportError:
            pass
        return
    import tensorlogic as tl

    tl.clear_cache()
    gc.collect()
    try:
        import cupy

        cupy.get_default_memory_pool().free_all_blocks()
    except ImportError:
        pass


def _reset_peak(name: str) -> None:
    if name.startswith("torch"):
        import torch

        torch.cuda.init()
        torch.zeros(1, device="cuda")  # the context exists before the first reading
        torch.cuda.reset_peak_memory_stats()
    else:
        import cupy

        cupy.zeros(1)
        cupy.get_default_memory_pool().free_all_blocks()
    _USED0[:] = [_device_used()]


def _peak(name: str) -> dict:
    # device_used_mb: what the process took from the device beyond its context (library
    # workspaces and CUDA-graph pools included), an upper bound of its peak
    used = {"device_used_mb": (_device_used() - _USED0[0]) / 2**20}
    if name.startswith("torch"):
        import torch

        return {
            "peak_mb": torch.cuda.max_memory_reserved() / 2**20,
            "peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
            **used,
        }
    import cupy

    # the pool never returned a block since the reset: what it holds is the peak it needed
    return {"peak_mb": cupy.get_default_memory_pool().total_bytes() / 2**20, **used}


# ------------------------------------------------------------------ MLP example accuracy
def accuracy_worker(which: str, tmp: Path) -> None:
    """Train examples/mlp_classifier.py's task with ours or torch; write the accuracy."""
    import mlp_classifier as ex

    if which == "ours":
        res = ex.main(progress=False)
        out = {"accuracy": res["accuracy"], "epoch_losses": res["epoch_losses"]}
    else:
        out = _torch_classifier(ex)
    (tmp / f"accuracy-{which}.json").write_text(json.dumps(out))


def _torch_classifier(ex) -> dict:
    import torch
    import torch.nn.functional as F

    c = ex.CONFIG
    x, labels = ex.make_data(c["n_train"], c["seed"])
    x_test, labels_test = ex.make_data(c["n_test"], c["seed"] + 100)
    p = {k: torch.nn.Parameter(torch.from_numpy(v)) for k, v in ex.init_params(c["seed"]).items()}
    opt = torch.optim.Adam(p.values(), lr=c["lr"])

    def logits(xb):
        h = F.relu(xb @ p["W1"] + p["b1"])
        h = F.relu(h @ p["W2"] + p["b2"])
        return h @ p["W3"] + p["b3"]

    xt, yt = torch.from_numpy(x), torch.from_numpy(labels)
    losses = []
    for epoch in range(c["epochs"]):
        order = torch.from_numpy(ex.batch_order(len(x), epoch))
        total = []
        for i in range(0, len(x), c["batch"]):
            idx = order[i : i + c["batch"]]
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(logits(xt[idx]), yt[idx])
            loss.backward()
            opt.step()
            total.append(loss.item())
        losses.append(float(np.mean(total)))
    with torch.no_grad():
        pred = logits(torch.from_numpy(x_test)).argmax(1).numpy()
    return {"accuracy": float((pred == labels_test).mean()), "epoch_losses": losses}


# ------------------------------------------------------------------ parent
RESULTS_FILE = HERE / "results" / "bench_train.json"


def name_is_default(args) -> bool:
    """Whether this run writes results/bench_train.json."""
    return args.name in (None, "bench_train")


_THREAD_VARS = (
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
    "NUMBA_NUM_THREADS",
    "TL_NUM_THREADS",
)


def _run(args_list: list[str], threads: int | None = None) -> int:
    env = dict(os.environ)
    if threads:
        env.update({k: str(threads) for k in _THREAD_VARS})
    return subprocess.call([sys.executable, __file__, *args_list], cwd=HERE, env=env)


def _grad_err(tmp: Path, name: str, i: int, peer: str) -> float | None:
    a, b = tmp / f"{_file(name)}-{i}.npz", tmp / f"{_file(peer)}-{i}.npz"
    if not (a.exists() and b.exists()):
        return None
    with np.load(a) as za, np.load(b) as zb:
        return max(
            float(
                np.max(np.abs(za[k].astype(np.float64) - zb[k])) / (np.max(np.abs(zb[k])) + 1e-30)
            )
            for k in zb.files
        )


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds of 0.05 s (smoke run)")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--min-time", type=float, default=0.5)
    ap.add_argument("--device", action="store_true", help="bf16 on the current CUDA GPU")
    ap.add_argument("--contenders", default=None)
    ap.add_argument("--models", default=None, help="indices into the model list")
    ap.add_argument(
        "--no-accuracy",
        action="store_true",
        help="skip the examples/mlp_classifier.py accuracy runs",
    )
    ap.add_argument("--out", default=None, help="folder for the results JSON")
    ap.add_argument(
        "--threads",
        type=int,
        default=None,
        help="threads for every contender (default: each library's own)",
    )
    ap.add_argument("--name", default=None, help="results/<name>.json")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--accuracy", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--tmp", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    models = _models()
    indices = [int(i) for i in args.models.split(",")] if args.models else list(range(len(models)))
    if args.accuracy:
        accuracy_worker(args.accuracy, Path(args.tmp))
        return 0
    if args.worker:
        worker(args.worker, indices, args.rounds, args.min_time, Path(args.tmp), args.device)
        return 0
    if args.quick:
        args.rounds, args.min_time = 3, 0.05
    default = (GPU_OURS + GPU_PEERS) if args.device else (CPU_OURS + CPU_PEERS)
    names = [c.strip() for c in (args.contenders or ",".join(default)).split(",") if c.strip()]
    peers = GPU_PEERS if args.device else CPU_PEERS
    eager = peers[0]
    m0 = machine()
    print(
        f"machine: {m0['cpu']}, {m0['cores_usable']} cores, load {m0['loadavg_1min']:.2f}",
        flush=True,
    )
    results: dict[str, dict] = {}
    accuracy: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for name in names:
            print(f"== {name}", flush=True)
            results[name] = {}
            # on the GPU each model gets a process of its own: what one model's step leaves in
            # a library (cuBLAS workspaces of its streams, cached blocks) is not the next one's
            groups = [[i] for i in indices] if args.device else [indices]
            for group in groups:
                common = [
                    "--models",
                    ",".join(map(str, group)),
                    "--rounds",
                    str(args.rounds),
                    "--min-time",
                    str(args.min_time),
                    "--tmp",
                    str(tmp),
                ]
                rc = _run(
                    ["--worker", name, *common] + (["--device"] if args.device else []),
                    args.threads,
                )
                path = tmp / f"{_file(name)}.json"
                if path.exists():
                    results[name].update(json.loads(path.read_text()))
                    path.unlink()
                else:
                    err = {"error": f"worker exited with status {rc}"}
                    results[name].update({models[i].name: dict(err) for i in group})
        if not args.device and not args.no_accuracy:
            for which in ("ours", "torch"):
                _run(["--accuracy", which, "--tmp", str(tmp)])
                path = tmp / f"accuracy-{which}.json"
                accuracy[which] = (
                    json.loads(path.read_text()) if path.exists() else {"error": "worker failed"}
                )
        rows = []
        tol = GRAD_RTOL["gpu" if args.device else "cpu"]
        for i in indices:
            model = models[i]
            base = {p: results.get(p, {}).get(model.name, {}).get("ms") for p in peers}
            for name in names:
                r = results.get(name, {}).get(model.name, {})
                row = {"model": model.name, "contender": name, **r}
                if name != eager:
                    err = _grad_err(tmp, name, i, eager)
                    if err is not None:
                        row["grad_err_vs_torch"] = err
                        row["grads_ok"] = bool(err <= tol)
                if "ms" in r and not name.startswith("torch"):
                    for p, label in zip(peers, ("vs_eager", "vs_compile")):
                        if base.get(p):
                            row[label] = base[p] / r["ms"]
                    t_row = results.get(eager, {}).get(model.name, {})
                    if args.device and t_row.get("peak_mb") and "peak_mb" in r:
                        row["peak_vs_torch"] = r["peak_mb"] / t_row["peak_mb"]
                        row["used_vs_torch"] = r["device_used_mb"] / t_row["device_used_mb"]
                rows.append(row)
    cols = [
        "model",
        "contender",
        "ms",
        "vs_eager",
        "vs_compile",
        "grad_err_vs_torch",
        "grads_ok",
        "peak_mb",
        "peak_vs_torch",
        "device_used_mb",
        "used_vs_torch",
        "threads",
        "error",
    ]
    print(table(rows, cols))
    m1 = machine()
    extra = {
        "load_before": m0["loadavg_1min"],
        "load_after": m1["loadavg_1min"],
        "rounds": args.rounds,
        "min_time_s": args.min_time,
        "lr": LR,
        "mode": "gpu bf16 mixed precision" if args.device else "cpu float32",
        "grad_rtol": tol,
        "threads": args.threads or "default",
    }
    if not accuracy and not args.device and name_is_default(args):
        # keep the accuracy figures of the last run that measured them (the test suite reads
        # them) when this run skipped them
        old = RESULTS_FILE.exists() and json.loads(RESULTS_FILE.read_text()).get("mlp_example")
        if old:
            extra["mlp_example"] = old
    if accuracy:
        import mlp_classifier

        extra["mlp_example"] = {
            "config": mlp_classifier.CONFIG,
            **{f"{k}_accuracy": v.get("accuracy") for k, v in accuracy.items()},
            "runs": accuracy,
        }
        print(
            f"examples/mlp_classifier.py test accuracy: ours "
            f"{accuracy['ours'].get('accuracy')}, torch {accuracy['torch'].get('accuracy')}"
        )
    if args.device:
        extra["gpu"] = _gpu_name()
    name = args.name or ("bench_train_gpu" if args.device else "bench_train")
    path = write_results(name, rows, extra, peers=("torch", "cupy-cuda13x"))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / path.name).write_text(path.read_text())
        path = out / path.name
    print(f"load {m0['loadavg_1min']:.2f} -> {m1['loadavg_1min']:.2f}; wrote {path}")
    return 1 if any(r.get("grads_ok") is False for r in rows) else 0


def _gpu_name() -> str | None:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceProperties(0)["name"].decode()
    except Exception:  # noqa: BLE001 - reported as unknown
        return None


if __name__ == "__main__":
    sys.exit(main())
