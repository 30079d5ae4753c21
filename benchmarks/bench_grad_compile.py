"""Cost of gradients: tl.grad's compile time and the planned memory of a backward graph.

1. Compile time. A 1,000-node forward graph with a scalar loss is compiled on the numpy
   backend at O2; then ``tl.grad`` with respect to every weight plus the compile of its
   result. Target: grad + compile at most 3x the forward compile. Two graph families: "mix", a
   deep network of einsums, biases, tanh/relu/gelu/sigmoid, layer norms, softmaxes and
   residuals, and "mlp", einsums, biases, tanh/relu and residuals only. Each measurement runs
   in a fresh process (nothing cached between them); medians of several rounds.
2. Memory. The planned peak (arena of intermediates plus outputs, ``plan.planned_bytes``) of
   the forward graph with a loss, and of its gradient graph, for the models benchmark's MLP and
   transformer block: the backward keeps every forward value it reads (activations, softmax
   probabilities, layer-norm results) alive until its last use.

No peer is named for these targets: both sides of each ratio are tensorlogic. The gradients of
the two models are also checked against torch autograd (float32, the same weights, torch in
its own process; skipped when torch is not installed).

Usage: python benchmarks/bench_grad_compile.py [--quick]
Writes benchmarks/results/bench_grad_compile.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from _common import machine, table, write_results

HERE = Path(__file__).resolve().parent

COMPILE_CHILD = textwrap.dedent("""
    import json, sys, time
    import numpy as np
    import tensorlogic as tl

    def build(target, family):
        rng = np.random.default_rng(0)
        g = tl.EinsumGraph()
        h = g.input("x", (8, 16), "float32")
        weights, k = [], 0
        while len(g) < target - 4:
            w = g.constant(rng.standard_normal((16, 16)).astype(np.float32) * 0.25, name=f"w{k}")
            b = g.constant(rng.standard_normal(16).astype(np.float32) * 0.1, name=f"b{k}")
            weights += [f"w{k}", f"b{k}"]
            z = g.einsum("bi,ij->bj", h, w) + b
            if family == "mlp":  # einsums, biases, tanh/relu and residuals only
                z = (g.tanh, g.relu)[k % 2](z)
                h = z + h if k % 2 else z
                k += 1
                continue
            act = (g.tanh, g.relu, g.gelu, g.sigmoid)[k % 4]
            z = act(z)
            if k % 3 == 2:
                gam = g.constant(1 + 0.1 * rng.standard_normal(16).astype(np.float32),
                                 name=f"g{k}")
                weights.append(f"g{k}")
                z = g.layer_norm(z) * gam
            if k % 5 == 4:
                z = g.softmax(z) * 4.0
            h = z + h if k % 2 else z
            k += 1
        g.output(g.mean(g.square(h)), "loss")
        return g, weights

    which, target, family = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    g, weights = build(target, family)
    # imports and first-use costs, alike in both processes
    warm = tl.EinsumGraph(); a = warm.input("a", (2, 2)); warm.output(warm.sum(warm.exp(a)), "y")
    tl.compile(tl.grad(warm, "y", ["a"]), backend="numpy", opt_level=2, cache=False)
    t0 = time.perf_counter()
    if which == "forward":
        plan = tl.compile(g, backend="numpy", opt_level=2, cache=False)
        t_grad = 0.0
        nodes = len(g)
    else:
        gg = tl.grad(g, "loss", weights)
        t_grad = time.perf_counter() - t0
        plan = tl.compile(gg, backend="numpy", opt_level=2, cache=False)
        nodes = len(gg)
    total = time.perf_counter() - t0
    plan(x=np.ones((8, 16), np.float32))   # the plan runs (not timed)
    print(json.dumps({"which": which, "nodes": nodes, "forward_nodes": len(g),
                      "wrt": len(weights), "grad_s": t_grad, "total_s": total,
                      "steps": len(plan.steps)}))
""")

MEMORY_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np
    import tensorlogic as tl
    import _models

    model = {"mlp": _models.mlp(), "block": _models.block(4, 256, 256, 4)}[sys.argv[1]]
    arrays = model.arrays()
    g = model.graph(arrays)
    out = g.tensor(g.outputs["out"])
    g.output(g.mean(g.square(out)), "loss")
    weights = [n.name for n in g.nodes if n.kind == "constant" and n.name in arrays]
    feed = {k: arrays[k] for k in model.inputs}
    fwd = tl.compile(g, backend="numpy", opt_level=2, cache=False)
    fwd(**feed)
    gg = tl.grad(g, "loss", weights)
    back = tl.compile(gg, backend="numpy", opt_level=2, cache=False)
    grads = back(**feed)
    np.savez(sys.argv[3], **{w: grads["grad_" + w] for w in weights})
    wbytes = sum(arrays[w].nbytes for w in weights)
    print(json.dumps({"model": model.name, "weights": len(weights),
                      "weight_mb": wbytes / 2**20,
                      "forward_planned_mb": fwd.concrete.planned_bytes / 2**20,
                      "forward_arena_mb": fwd.memory.peak_bytes / 2**20,
                      "grad_planned_mb": back.concrete.planned_bytes / 2**20,
                      "grad_arena_mb": back.memory.peak_bytes / 2**20,
                      "grad_outputs_mb": (back.concrete.planned_bytes
                                          - back.memory.peak_bytes) / 2**20,
                      "forward_steps": len(fwd.steps), "grad_steps": len(back.steps)}))
""")


TORCH_CHILD = textwrap.dedent("""
    import json, math, sys
    sys.path.insert(0, sys.argv[2])
    import numpy as np
    import torch
    import torch.nn.functional as F
    import _models

    model = {"mlp": _models.mlp(), "block": _models.block(4, 256, 256, 4)}[sys.argv[1]]
    a = model.arrays()
    ours = np.load(sys.argv[3])
    t = {k: torch.tensor(v, requires_grad=k in ours.files) for k, v in a.items()}
    if sys.argv[1] == "mlp":
        h, n = t["x"], sum(1 for k in a if k.startswith("w"))
        for i in range(n):
            h = torch.einsum("bi,ij->bj", h, t[f"w{i}"]) + t[f"b{i}"]
            h = torch.relu(h) if i < n - 1 else h
        out = h
    else:
        x, d = t["x"], a["x"].shape[-1]
        q, k, v = (torch.einsum("bsd,hkd->bhsk", x, t[w]) for w in ("wq", "wk", "wv"))
        sc = torch.einsum("bhqk,bhsk->bhqs", q, k) * (1.0 / math.sqrt(a["wq"].shape[1]))
        ctx = torch.einsum("bhqs,bhsk->bqhk", torch.softmax(sc, -1), v)
        att = torch.einsum("bqhk,hkd->bqd", ctx, t["wo"])
        y = F.layer_norm(x + att, (d,)) * t["g1"] + t["be1"]
        m = F.gelu(torch.einsum("bsd,df->bsf", y, t["w1"]) + t["b1"], approximate="tanh")
        out = F.layer_norm(y + torch.einsum("bsf,fd->bsd", m, t["w2"]) + t["b2"], (d,))
        out = out * t["g2"] + t["be2"]
    torch.mean(out * out).backward()
    worst = max(float(np.abs(ours[w] - t[w].grad.numpy()).max())
                / max(float(np.abs(t[w].grad.numpy()).max()), 1e-30) for w in ours.files)
    print(json.dumps({"torch": torch.__version__, "max_rel_err_vs_torch": worst}))
""")


def child(code: str, *args: str) -> dict:
    out = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="one round, no block model")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args()
    rounds = 1 if args.quick else args.rounds
    rows = []
    for family in ("mix", "mlp"):
        runs = {"forward": [], "grad": []}
        for _ in range(rounds):  # interleaved, so load drifts hit both sides alike
            for which in runs:
                runs[which].append(child(COMPILE_CHILD, which, str(args.nodes), family))
        fwd = statistics.median(r["total_s"] for r in runs["forward"])
        grd = statistics.median(r["total_s"] for r in runs["grad"])
        rows.append(
            {
                "section": "compile",
                "family": family,
                "forward_nodes": runs["forward"][0]["nodes"],
                "grad_nodes": runs["grad"][0]["nodes"],
                "wrt": runs["grad"][0]["wrt"],
                "forward_compile_s": fwd,
                "grad_transform_s": statistics.median(r["grad_s"] for r in runs["grad"]),
                "grad_and_compile_s": grd,
                "ratio": grd / fwd,
                "target_ratio": 3.0,
                "met": grd / fwd <= 3.0,
                "rounds": rounds,
                "forward_all_s": [r["total_s"] for r in runs["forward"]],
                "grad_all_s": [r["total_s"] for r in runs["grad"]],
            }
        )
        print(
            table(
                rows[-1:],
                [
                    "family",
                    "forward_nodes",
                    "grad_nodes",
                    "forward_compile_s",
                    "grad_transform_s",
                    "grad_and_compile_s",
                    "ratio",
                    "met",
                ],
            ),
            flush=True,
        )
    mem = []
    for name in ("mlp",) if args.quick else ("mlp", "block"):
        with tempfile.TemporaryDirectory() as tmp:
            path = str(Path(tmp) / "grads.npz")
            r = child(MEMORY_CHILD, name, str(HERE), path)
            try:  # torch autograd on the same weights (a peer, in its own process)
                r.update(child(TORCH_CHILD, name, str(HERE), path))
            except subprocess.CalledProcessError as exc:
                r["torch"] = f"not run: {exc.stderr.strip().splitlines()[-1]}"
        r["section"] = "memory"
        r["ratio"] = r["grad_planned_mb"] / r["forward_planned_mb"]
        mem.append(r)
    print(
        table(
            mem,
            [
                "model",
                "forward_planned_mb",
                "grad_planned_mb",
                "grad_arena_mb",
                "grad_outputs_mb",
                "weight_mb",
                "ratio",
                "max_rel_err_vs_torch",
            ],
        ),
        flush=True,
    )
    path = write_results(
        "bench_grad_compile", rows + mem, {"load_at_end": machine()["loadavg_1min"]}
    )
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
