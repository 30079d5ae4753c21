"""Run every CPU benchmark script in turn (GPU ones only where a GPU is usable).

Usage: python benchmarks/run_all.py [--quick] [NAME ...]
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
GPU_SCRIPTS = {"bench_gpu.py"}


def gpu_usable() -> bool:
    """True if CuPy sees a CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - no CuPy or no driver both mean no GPU
        return False


def main(argv: list[str]) -> int:
    flags = [a for a in argv if a.startswith("--")]
    names = [a for a in argv if not a.startswith("--")]
    scripts = sorted(HERE.glob("bench_*.py"))
    if names:
        scripts = [s for s in scripts if s.stem in names or s.name in names]
    failed = []
    for script in scripts:
        if script.name in GPU_SCRIPTS and not gpu_usable():
            print(f"== {script.name}: skipped (no GPU)")
            continue
        print(f"== {script.name}", flush=True)
        rc = subprocess.call([sys.executable, str(script), *flags], cwd=HERE)
        if rc:
            failed.append(script.name)
    if failed:
        print(f"failed: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
