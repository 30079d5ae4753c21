"""Probe: where the host time of a one-kernel GPU plan goes (softmax / layer norm 4096x1024).

Times, per call and synchronized per batch: the whole plan call, the concrete plan's run, the
generated kernel's launch alone, ``cupy.empty`` of the output, and torch's softmax; then runs
the plan call under cProfile and prints the functions with the most own time. Writes JSON
(``--out``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import cupy as cp  # noqa: E402
from _gpu_common import wall_time  # noqa: E402

import tensorlogic as tl  # noqa: E402

try:
    import torch
except ImportError:
    torch = None


def probe(op: str, shape, res: dict) -> None:
    g = tl.EinsumGraph()
    g.output(getattr(g, op)(g.input("x", shape), -1), "y")
    plan = tl.compile(g, backend="cupy", opt_level=0)
    x = cp.random.standard_normal(shape, dtype=cp.float32)
    cplan = plan.concrete
    step_fn, _ins, _o = cplan.program[0]
    out = cp.empty(shape, cp.float32)
    rows = {
        "plan call": lambda: plan(x=x),
        "plan call, out= given": lambda: plan(x=x, out={"y": out}),
        "concrete run": lambda: cplan.run({"x": x}, None),
        "kernel launch alone": lambda: step_fn([x], out),
        "cupy.empty output": lambda: cp.empty(shape, cp.float32),
    }
    if torch is not None:
        tx = torch.from_dlpack(x)
        fn = {
            "softmax": lambda: torch.softmax(tx, -1),
            "layer_norm": lambda: torch.nn.functional.layer_norm(tx, (shape[-1],)),
        }[op]
        rows["torch"] = fn
    print(f"{op} {shape[0]}x{shape[1]} float32 (runner: {cplan.runner})")
    r = res.setdefault(f"{op}_{shape[0]}x{shape[1]}", {})
    for name, fn in rows.items():
        t = wall_time(fn, 2000, batches=9, warmup=50)
        r[name] = t * 1e6
        print(f"  {name:<24} {t * 1e6:7.2f} us")
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        plan(x=x)
    prof.disable()
    cp.cuda.Device().synchronize()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(14)
    text = s.getvalue()
    r["profile"] = text
    print(text[text.find("ncalls") :][:2500])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="gpu_host_probe.json")
    args = ap.parse_args()
    props = cp.cuda.runtime.getDeviceProperties(0)
    card = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    print(f"card: {card}")
    res: dict = {"card": card}
    for op in ("softmax", "layer_norm"):
        probe(op, (4096, 1024), res)
    Path(args.out).write_text(json.dumps(res, indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
