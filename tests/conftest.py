"""Shared fixtures: the ``backend`` fixture over every available backend, the gpu marker."""

from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

import tensorlogic as tl

CPU_BACKENDS = ("numpy", "numba")


def pytest_addoption(parser):
    parser.addoption(
        "--require-gpu",
        action="store_true",
        default=False,
        help="fail (instead of skip) gpu tests when no CUDA GPU is usable",
    )
    parser.addoption(
        "--fuzz-seed",
        type=int,
        default=None,
        help="seed of the differential fuzz tests (default: a fresh one, printed)",
    )


@functools.lru_cache(maxsize=1)
def gpu_available() -> bool:
    """True if CuPy imports and sees a CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # noqa: BLE001 - any failure means no usable GPU
        return False


def pytest_runtest_setup(item):
    if item.get_closest_marker("gpu") is None:
        return
    if gpu_available():
        return
    if item.config.getoption("--require-gpu"):
        pytest.fail("gpu test run with --require-gpu but no CUDA GPU is usable")
    pytest.skip("needs a CUDA GPU with CuPy")


def _backend_params():
    params = []
    for name in ("numpy", "numba", "cupy"):
        if name not in tl.backends.registered_backends():
            continue
        marks = [pytest.mark.gpu] if name == "cupy" else []
        params.append(pytest.param(name, marks=marks, id=name))
    return params


@pytest.fixture(params=_backend_params())
def backend(request) -> str:
    """Name of each registered backend; the cupy one carries the gpu marker."""
    return request.param


@pytest.fixture
def rng():
    """A fresh random generator; the seed is printed on failure through pytest's -ra output."""
    seed = np.random.SeedSequence().entropy % (2**32)
    print(f"rng seed: {seed}")
    return np.random.default_rng(seed)


def to_numpy(x):
    """Host copy of a backend array."""
    if hasattr(x, "get"):
        return x.get()
    return np.asarray(x)


def tolerance(dtype, reduction: int = 1) -> dict:
    """rtol/atol that fit a dtype and a reduction length."""
    eps = np.finfo(dtype).eps
    scale = max(1.0, float(np.sqrt(reduction)))
    return {"rtol": 64 * eps * scale, "atol": 64 * eps * scale}


def run_in_threads(worker, n: int) -> None:
    """Run ``worker(k)`` for k in range(n), each on its own thread; re-raise the first failure."""
    errors: list[BaseException] = []

    def guarded(k: int) -> None:
        try:
            worker(k)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(k,)) for k in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
