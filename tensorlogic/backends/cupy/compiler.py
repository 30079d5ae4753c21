"""Turning generated source into loaded CUDA functions, through the disk cache (needs CuPy).

PTX is linked to a cubin with the driver's JIT linker; CUDA C is compiled to a cubin by NVRTC.
Either binary is stored under a key of (source, path, compute capability, toolchain) and later
loaded with ``cupy.cuda.function.Module().load``.
"""

from __future__ import annotations

import threading
import time

import cupy
from cupy.cuda import function as cufunction

from ...runtime import hooks
from ...errors import BackendError
from .cache import KernelCache


def _link_ptx(ptx: str, name: str) -> bytes:
    """PTX text -> cubin through the driver's JIT linker."""
    state = cufunction.LinkState()
    try:
        state.add_ptr_data(ptx.encode(), name + ".ptx")
    except TypeError:  # older CuPy took the text as str
        state.add_ptr_data(ptx, name + ".ptx")
    return state.complete()


def _nvrtc(src: str, name: str, arch: str) -> bytes:
    """CUDA C -> cubin with NVRTC."""
    from cupy.cuda import nvrtc

    prog = nvrtc.createProgram(src, name + ".cu", [], [])
    try:
        try:
            nvrtc.compileProgram(prog, [f"--gpu-architecture=sm_{arch}", "--std=c++14"])
        except nvrtc.NVRTCError as exc:
            log = nvrtc.getProgramLog(prog)
            raise BackendError(f"NVRTC could not compile kernel {name}: {exc}\n{log}") from exc
        return nvrtc.getCUBIN(prog)
    finally:
        nvrtc.destroyProgram(prog)


class KernelCompiler:
    """Compiles and loads generated kernels for one device, with a memory and a disk cache."""

    def __init__(self, cache: KernelCache, arch: str) -> None:
        self.cache = cache
        self.arch = arch
        self.toolchain = f"cupy{cupy.__version__}-driver{cupy.cuda.runtime.driverGetVersion()}"
        self._modules: dict[str, cufunction.Module] = {}
        self._lock = threading.Lock()

    def function(self, source: str, name: str, path: str) -> cufunction.Function:
        """The loaded kernel ``name`` of ``source`` (``path``: "ptx" or "cuda")."""
        key = self.cache.key(source, path, self.arch, self.toolchain)
        with self._lock:
            mod = self._modules.get(key)
            if mod is not None:
                self.cache.stats.memory_hits += 1
                return mod.get_function(name)
            t0 = time.perf_counter()
            binary = self.cache.get(key)
            hit = binary is not None
            if binary is None:
                binary = (
                    _link_ptx(source, name) if path == "ptx" else _nvrtc(source, name, self.arch)
                )
                self.cache.put(key, binary)
            mod = cufunction.Module()
            mod.load(binary)
            self._modules[key] = mod
            dt = time.perf_counter() - t0
        hooks.compile_event(
            "codegen", f"{'load' if hit else 'compile'} {name}", t0, dt, path=path, cache_hit=hit
        )
        return mod.get_function(name)
