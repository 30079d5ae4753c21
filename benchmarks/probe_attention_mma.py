"""Variants of the 16-bit tensor-core attention kernel (``attention_mma``) timed against torch's
flash SDPA in one process: block shapes, the raw-score form (``RAW_SCORES``), and
optionally an earlier version of the kernel's module (``--baseline FILE``, to compare code
changes on the same card in the same run). Attention alone (B=1, 8 heads, bfloat16); contenders
take turns (``gpu_times``), CUDA-event medians; each row's max |diff| from a float32 reference on
the same 16-bit inputs.

Usage: python benchmarks/probe_attention_mma.py [--seqs 4096,16384] [--baseline FILE]
       [--out FILE]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import numpy as np

from _common import machine, table, versions


def _variants(hd: int, causal: bool, baseline) -> list[tuple[str, object, int, object]]:
    """(label, block shape or None for the default, raw scores, render module)."""
    from tensorlogic.backends.cupy import attention_mma

    C = attention_mma.Config
    out = []
    if baseline is not None:
        out.append(("baseline default", None, True, baseline))
    out.append(("default", None, True, attention_mma))
    out.append(("default, generic scores", None, False, attention_mma))
    if hd > 64:
        if not causal:
            out.append(("8 x 32 rows, q smem, raw", C(8, 2, False), True, attention_mma))
            out.append(
                ("4 x 32 rows, q smem, 32 keys, raw", C(4, 2, False, bn=32), True, attention_mma)
            )
    return out


def main() -> None:
    import cupy as cp
    import torch
    from _gpu_common import gpu_times
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import tensorlogic as tl
    from tensorlogic.backends.cupy import attention_gpu, attention_mma

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seqs", default="4096,16384")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--baseline", default=None, help="an earlier attention_mma.py to compare")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    baseline = None
    if args.baseline:
        spec = importlib.util.spec_from_file_location(
            "tensorlogic.backends.cupy._attention_mma_baseline", args.baseline
        )
        baseline = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = baseline  # dataclasses look their module up there
        spec.loader.exec_module(baseline)
    own_render = attention_mma.render
    rows = []
    dev = cp.cuda.runtime.getDeviceProperties(0)["name"].decode()
    for hd in map(int, args.head_dims.split(",")):
        for s in map(int, args.seqs.split(",")):
            for causal in (False, True):
                shape = (1, 8, s, hd)
                rng = np.random.default_rng(0)
                host = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
                ins = {n: cp.asarray(a.astype("bfloat16")) for n, a in host.items()}
                tq = {
                    n: torch.as_tensor(a, device="cuda").to(torch.bfloat16) for n, a in host.items()
                }
                with sdpa_kernel([SDPBackend.MATH]):
                    ref = torch.nn.functional.scaled_dot_product_attention(
                        *(tq[n].float() for n in "qkv"), is_causal=causal
                    )
                ref = ref.cpu().numpy()

                def sdpa():
                    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                        return torch.nn.functional.scaled_dot_product_attention(
                            tq["q"], tq["k"], tq["v"], is_causal=causal
                        )

                g = tl.EinsumGraph()
                q, k, v = (g.input(n, shape, "bfloat16") for n in "qkv")
                g.output(g.attention(q, k, v, causal=causal), "y")
                fns = {"torch flash": sdpa}
                diffs = {"torch flash": float(np.abs(sdpa().float().cpu().numpy() - ref).max())}
                for label, cfg, raw, mod in _variants(hd, causal, baseline):
                    attention_gpu.MMA_CONFIG = cfg
                    attention_gpu.RAW_SCORES = raw
                    attention_mma.render = mod.render
                    try:
                        plan = tl.compile(g, backend="cupy", cache=False)
                        y = cp.asnumpy(plan(**ins)["y"]).astype(np.float32)
                    except Exception as exc:  # noqa: BLE001 - report and go on
                        print(f"{label}: {type(exc).__name__}: {exc}"[:300])
                        continue
                    finally:
                        attention_mma.render = own_render
                        attention_gpu.MMA_CONFIG = None
                        attention_gpu.RAW_SCORES = True
                    fns[label] = lambda plan=plan: plan(**ins)
                    diffs[label] = float(np.abs(y - ref).max())
                inner = 10 if s <= 4096 else 3
                times = gpu_times(fns, inner, rounds=5)
                t_torch = times["torch flash"]
                for label, t in times.items():
                    rows.append(
                        {
                            "hd": hd,
                            "S": s,
                            "causal": causal,
                            "kernel": label,
                            "ms": t * 1e3,
                            "ratio_torch_over_ours": t_torch / t,
                            "TFLOPs": 4 * 8 * s * s * hd / (2 if causal else 1) / t / 1e12,
                            "max_abs_diff_vs_f32": diffs[label],
                        }
                    )
                print(table(rows[-len(times) :], list(rows[-1])), flush=True)
                cp.get_default_memory_pool().free_all_blocks()
    print(f"bf16 attention kernel variants on {dev}")
    print(table(rows, list(rows[0])))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {
                    "benchmark": "probe_attention_mma",
                    "device": dev,
                    "machine": machine(),
                    "versions": versions("torch", "cupy"),
                    "rows": rows,
                },
                indent=1,
            )
        )
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
