"""Block shapes of the float32 tensor-core attention kernel (``attention_tf32``), timed against
torch's SDPA in float32 (its memory-efficient kernel: 3xTF32 on the tensor cores) and the
written-out form, attention alone (B=1, 8 heads), CUDA-event medians; each row's error against
a float64 reference on the same inputs.

Usage: python benchmarks/probe_attention_tf32.py [--seqs 1024,4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from _common import machine, table, versions

CONFIGS = [  # warps, mt, q_in_regs, bn, and whether to time the one-MMA TF32 variant too
    (4, 1, False, 32, True),
    (4, 1, False, 64, False),
    (4, 1, True, 32, False),
    (8, 1, False, 32, False),
    (4, 2, False, 32, False),
]


def main() -> None:
    import cupy as cp
    import torch
    from _gpu_common import gpu_time

    import tensorlogic as tl
    from tensorlogic.backends.cupy import attention_gpu, attention_tf32

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="1024,4096")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--out", default=None)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument(
        "--configs",
        default=None,
        help="block shapes 'warps,m-tiles,query-in-registers(0/1),keys,one-MMA(0/1);...'",
    )
    args = ap.parse_args()
    configs = CONFIGS
    if args.configs:
        configs = [
            (int(w), int(mt), qr == "1", int(bn), one == "1")
            for w, mt, qr, bn, one in (c.split(",") for c in args.configs.split(";"))
        ]
    rows = []
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for hd in map(int, args.head_dims.split(",")):
        for s in map(int, args.seqs.split(",")):
            for causal in (False, True):
                shape = (args.batch, 8, s, hd)
                rng = np.random.default_rng(0)
                host = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
                ins = {n: cp.asarray(a) for n, a in host.items()}
                tq = {n: torch.as_tensor(a, device="cuda") for n, a in host.items()}
                ref = torch.nn.functional.scaled_dot_product_attention(
                    *(tq[n].double() for n in "qkv"), is_causal=causal
                )
                ref = ref.cpu().numpy()

                def err(y):
                    y = np.asarray(y, np.float64)
                    return float(np.linalg.norm(y - ref) / np.linalg.norm(ref))

                def sdpa():
                    return torch.nn.functional.scaled_dot_product_attention(
                        tq["q"], tq["k"], tq["v"], is_causal=causal
                    )

                inner = 10 if s <= 4096 else 3
                base = {"hd": hd, "S": s, "causal": causal}
                t_torch = gpu_time(sdpa, inner, batches=5)
                rows.append(
                    {
                        **base,
                        "kernel": "torch SDPA fp32",
                        "ms": t_torch * 1e3,
                        "vs_torch": 1.0,
                        "rel_err": err(sdpa().cpu().numpy()),
                    }
                )
                g = tl.EinsumGraph()
                q, k, v = (g.input(n, shape) for n in "qkv")
                g.output(g.attention(q, k, v, causal=causal), "y")
                for w, mt, qr, bn, one in configs:
                    for split in (True, False) if one else (True,):
                        cfg = attention_tf32.Config(w, mt, qr, bn, causal)
                        attention_gpu.TF32_CONFIG = cfg
                        prec = "highest" if split else "tf32"
                        try:
                            plan = tl.compile(g, backend="cupy", cache=False, matmul_precision=prec)
                            y = cp.asnumpy(plan(**ins)["y"])
                            t = gpu_time(lambda plan=plan: plan(**ins), inner, batches=5)
                        except Exception as exc:  # noqa: BLE001 - report and go on
                            print(f"{cfg} split={split}: {type(exc).__name__}: {exc}"[:300])
                            continue
                        rows.append(
                            {
                                **base,
                                "kernel": f"{'3x' if split else '1x'} w{w} m{mt}"
                                f"{' q' if qr else ''} n{bn}",
                                "ms": t * 1e3,
                                "vs_torch": t_torch / t,
                                "rel_err": err(y),
                            }
                        )
                attention_gpu.TF32_CONFIG = None
                if s <= 4096:
                    wg = tl.EinsumGraph()
                    q, k, v = (wg.input(n, shape) for n in "qkv")
                    sc = wg.einsum("bhqd,bhkd->bhqk", q, k) * (hd**-0.5)
                    if causal:
                        sc = sc + wg.constant(np.triu(np.full((s, s), -np.inf, np.float32), 1))
                    wg.output(wg.einsum("bhqk,bhkd->bhqd", wg.softmax(sc, -1), v), "y")
                    wplan = tl.compile(wg, backend="cupy", cache=False, fuse_attention=False)
                    t = gpu_time(lambda: wplan(**ins), inner, batches=5)
                    rows.append(
                        {
                            **base,
                            "kernel": "written out (cuBLAS fp32)",
                            "ms": t * 1e3,
                            "vs_torch": t_torch / t,
                            "rel_err": err(cp.asnumpy(wplan(**ins)["y"])),
                        }
                    )
                    del wplan
                    cp.get_default_memory_pool().free_all_blocks()
                print(
                    table(
                        [
                            r
                            for r in rows
                            if r["S"] == s and r["hd"] == hd and r["causal"] == causal
                        ],
                        list(rows[0]),
                    ),
                    flush=True,
                )
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "benchmark": "probe_attention_tf32",
                    "device": dev,
                    "machine": machine(),
                    "versions": versions("torch", "cupy"),
                    "rows": rows,
                },
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
