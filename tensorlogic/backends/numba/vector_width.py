"""512-bit vectors for the numba backend's kernels on CPUs with AVX-512.

LLVM tunes its code for Intel's AVX-512 server cores to prefer 256-bit vectors (its
``prefer-256-bit`` tuning flag), so numba's loops use half the vector width those cores have. For
the kernels here, which are arithmetic-bound (the fast exp of a softmax, the GELU of a GEMM
epilogue), the full width is faster: on the 16-core Xeon host (three alternating process pairs)
a float32 softmax over 2048 x 2048 took 0.28-0.29 ms against 0.38-0.42 ms, a 256 x 1024 GELU
epilogue tile on one thread 0.15-0.20 ms against 0.20-0.22, and the B=4 S=256 transformer block
2.16-2.39 ms against 2.31-2.52 ms; the 4-layer MLP, all GEMM, was the same.

``configure()`` asks numba for the host's features without that flag. It runs when the numba
backend is first imported, and only while it can take effect for the whole process: before
numba has compiled anything (its CPU target is built once), where the host has AVX-512, where
neither NUMBA_CPU_NAME nor NUMBA_CPU_FEATURES is set (the user's choice stands), and unless
TL_NUMBA_WIDE_VECTORS=0. It sets NUMBA_CPU_FEATURES, which numba reads from the environment,
so the choice also holds in child processes and for numba functions of the user's own.
"""

from __future__ import annotations

import os

PREFER_256 = "prefer-256-bit"


def features_without_preference(host_features: str) -> str | None:
    """The host's LLVM feature string with the 256-bit preference turned off, or None where
    there is nothing to change (no AVX-512)."""
    feats = [f for f in host_features.split(",") if f]
    if "+avx512f" not in feats:
        return None
    kept = [f for f in feats if f.lstrip("+-") != PREFER_256]
    return ",".join(kept + ["-" + PREFER_256])


def configure() -> bool:
    """Turn the 256-bit preference off for this process where that is possible and wanted (see
    the module docstring); whether it did."""
    if os.environ.get("TL_NUMBA_WIDE_VECTORS", "1") in ("0", "false", "no"):
        return False
    if "NUMBA_CPU_FEATURES" in os.environ or "NUMBA_CPU_NAME" in os.environ:
        return False
    import numba
    from numba.core import registry

    if "_toplevel_target_context" in registry.cpu_target.__dict__:
        return False  # numba has compiled already: its target machine is fixed
    import llvmlite.binding as llvm

    try:
        host = llvm.get_host_cpu_features().flatten()
    except RuntimeError:
        return False
    wanted = features_without_preference(host)
    if wanted is None:
        return False
    os.environ["NUMBA_CPU_FEATURES"] = wanted
    numba.config.reload_config()
    return True
