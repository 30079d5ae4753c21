"""CUDA-graph execution of a concrete plan, with stream launches as the fallback.

After a warm-up call (kernels loaded, cuBLAS handles and CuPy's pool warmed), the whole step
program is captured once on a non-default stream into fixed buffers: the plan's own input,
intermediate and output buffers. A later call copies its inputs into the fixed input buffers,
replays the graph, and copies the outputs out. A plan that cannot be captured runs with stream
launches, and ``str(runner)`` (shown by ``print(plan)``) says which path runs and why.
"""

from __future__ import annotations

import threading
from typing import Any

import cupy
import numpy as np

from ...errors import MemoryBudgetError
from ...runtime import hooks
from ...runtime.steps import run_program
from ...runtime.units import format_bytes
from ..base import PlanRunner as BasePlanRunner
from . import pdl

# A device-wide synchronize is illegal while any stream of the process is capturing
# (cudaErrorStreamCaptureUnsupported), so captures and device synchronizes take turns.
CAPTURE_GATE = threading.RLock()

# Cost model for cuda_graph="auto": a Python-side launch costs about this much host time, and
# device-to-device copies move about this many bytes per second (H100: ~2.9e12 read+write).
LAUNCH_SECONDS = 10e-6
COPY_CALL_SECONDS = 4e-6
COPY_BYTES_PER_SECOND = 2.5e12
_D2D = 3  # cudaMemcpyDeviceToDevice


class PlanRunner(BasePlanRunner):
    """Runs one concrete plan: stream launches, or CUDA-graph replay after a warm-up call."""

    def __init__(self, backend, plan, mode: Any) -> None:
        self.backend = backend
        self.mode = mode
        self.calls = 0
        self.graph = None
        self.stream = None
        self.env: list | None = None
        self.fixed_in: dict[str, Any] = {}
        self.fixed_out: dict[str, Any] = {}
        self.replays = 0
        self._busy = threading.Lock()
        n_views = sum(1 for s in plan.steps if s.view)
        io = sum(b.nbytes for b in plan.buffers if b.role in ("input", "output"))
        n_io = sum(1 for b in plan.buffers if b.role in ("input", "output"))
        saved = (len(plan.steps) - n_views) * LAUNCH_SECONDS
        cost = io / COPY_BYTES_PER_SECOND + n_io * COPY_CALL_SECONDS + LAUNCH_SECONDS
        if mode is False:
            self.enabled, self.status = False, "off (cuda_graph=False)"
        elif mode == "auto" and saved <= cost:
            self.enabled = False
            self.status = (
                f"off (auto: {len(plan.steps)} step(s) save ~{saved * 1e6:.0f} us of "
                f"launches, copying {format_bytes(io)} of "
                f"inputs/outputs costs ~{cost * 1e6:.0f} us)"
            )
        else:
            self.enabled, self.status = True, "pending (captured on the second call)"
        # warm-up and capture share one stream, so that cuBLAS's per-stream workspace and CuPy's
        # per-stream pool blocks exist before capture. It is non-blocking: a blocking stream in
        # capture makes any other thread's legacy-stream work fail (cudaErrorStreamCaptureImplicit),
        # so ordering with the caller's stream is made explicit with events instead.
        self.stream = cupy.cuda.Stream(non_blocking=True) if self.enabled else None
        # what is allocated while capturing (temporaries of a step) comes from a pool that only
        # the graph uses, so later allocations never get memory a replay writes to
        self.capture_pool = None
        # a plan without intermediates needs no pooled arena: each call copies this table
        self._template = None if plan.memory.offsets else plan.new_arena()
        # one kernel from inputs and constants to one fresh output (a softmax, a fused group):
        # its arguments are looked up directly, which saves a third of the Python per call
        self._one = None
        if (
            self._template is not None
            and len(plan.program) == 1
            and not plan.steps[0].view
            and len(plan.fresh_outputs) == len(plan.result_slots) == 1
        ):
            fn, ins, o = plan.program[0]
            names = {bid: name for name, bid in plan.input_slots}
            name, bid, shape, dtype = plan.fresh_outputs[0]
            if o == bid:
                self._one = (
                    fn,
                    tuple((names.get(i), self._template[i]) for i in ins),
                    name,
                    shape,
                    dtype,
                )
        # ready inputs of such a plan launch its kernel with no layer in between:
        # CompiledPlan.__call__ tries this first (see _direct_call)
        self.direct = (
            self._direct_call(len(plan.input_slots))
            if self._one is not None and not self.enabled
            else None
        )

    def __str__(self) -> str:
        return f"cuda graph: {self.status}"

    def _direct_call(self, n_inputs: int):
        """``direct(given) -> results | None`` for a one-kernel plan, or None.

        It takes the keyword inputs of a plan call; when each is a CuPy array of exactly the
        layout the kernel's contiguous variant was built for, it allocates the output and
        launches, skipping the input binding, the runner and the kernel's layout lookup
        (about a quarter of a small call's host time). Anything else returns None, and the call
        takes the general path, which also produces the errors.
        """
        from .backend import GeneratedKernel  # the backend module imports this one

        fn, args, name, shape, dtype = self._one
        if not isinstance(fn, GeneratedKernel) or fn.direct_run is None:
            return None
        launch = fn.direct_run
        ndarray, empty = cupy.ndarray, cupy.empty
        oom = cupy.cuda.memory.OutOfMemoryError
        slots = tuple(
            (n, c, fn.in_shapes[k], np.dtype(fn.in_dtypes[k]), fn._contig[k])
            for k, (n, c) in enumerate(args)
        )

        def direct(given):
            if len(given) != n_inputs:
                return None
            xs = []
            for n, c, shp, dt, strides in slots:
                if n is None:
                    xs.append(c)
                    continue
                x = given.get(n)
                if (
                    type(x) is not ndarray
                    or x.strides != strides
                    or x.shape != shp
                    or x.dtype != dt
                ):
                    return None
                xs.append(x)
            try:
                out = empty(shape, dtype)
            except oom:
                return None  # the general path reports it as MemoryBudgetError
            launch(out, xs)
            return {name: out}

        return direct

    # ------------------------------------------------------------------ calling
    def __call__(self, plan, inputs, out):
        try:
            if not self.enabled:
                if hooks.active() is not None:
                    return plan.run_steps(inputs, out)
                return self._launches(plan, inputs, out)
            if hooks.active() is not None:
                return plan.run_steps(inputs, out)
            # the graph owns one set of fixed buffers: a call that finds it busy (another thread)
            # runs step by step on its own pooled arena instead of racing for those buffers
            if not self._busy.acquire(blocking=False):
                return plan.run_steps(inputs, out)
            try:
                self.calls += 1
                if self.graph is None:
                    if self.calls == 1:  # warm-up: load kernels, create handles, fill the pool
                        caller = self._follow_caller()
                        # the results are the caller's: allocated on its stream, so their memory
                        # goes back to blocks the caller's later allocations (replayed calls'
                        # outputs) reuse, not to the capture stream's
                        given, by_buffer = dict(out or {}), {}
                        for name, bid, shape, dtype in plan.fresh_outputs:
                            if given.get(name) is None:  # names of one buffer share one array
                                if bid not in by_buffer:
                                    by_buffer[bid] = cupy.empty(shape, dtype)
                                given[name] = by_buffer[bid]
                        with self.stream:
                            results = plan.run_steps(inputs, given)
                        caller.wait_event(self.stream.record())
                        return results
                    if not self._capture(plan, inputs):
                        return plan.run_steps(inputs, out)
                return self._replay(plan, inputs, out)
            finally:
                self._busy.release()
        except cupy.cuda.memory.OutOfMemoryError as exc:
            need = plan.planned_bytes
            free = self.backend.free_memory()
            raise MemoryBudgetError(
                f"out of GPU memory running the plan: it plans {need} bytes ({format_bytes(need)}: "
                f"intermediates {format_bytes(plan.memory.peak_bytes)} plus outputs) and the "
                f"device has {free} bytes ({format_bytes(free)}) free; {exc}",
                planned=need,
                free=free,
            ) from exc

    def _launches(self, plan, inputs, out):
        """Stream launches: the one-kernel shortcut, else the plan's step loop (a plan without
        intermediates runs in a copy of its buffer table instead of a pooled arena)."""
        if self._one is not None:
            fn, args, name, shape, dtype = self._one
            arr = out.get(name) if out else None
            if arr is None:
                arr = cupy.empty(shape, dtype)
            return {name: fn([inputs[n] if n is not None else c for n, c in args], arr)}
        template = self._template
        return plan.run_steps(inputs, out, None if template is None else template.copy())

    def _capture(self, plan, inputs) -> bool:
        # the graph takes the arena the warm-up call left idle in the plan's pool (and keeps it):
        # a second arena would hold the plan's intermediates twice on the device
        env = plan.pool.acquire()
        for name, bid in plan.input_ids.items():
            b = plan.buffers[bid]
            self.fixed_in[name] = env[bid] = cupy.empty(b.shape, b.dtype)
        for name, bid in plan.output_ids.items():
            b = plan.buffers[bid]
            if b.role == "output" and name not in self.fixed_out:
                arr = env[bid] if env[bid] is not None else cupy.empty(b.shape, b.dtype)
                env[bid] = arr
                self.fixed_out[name] = arr
        stream = self.stream
        graph = None
        relaxed = getattr(cupy.cuda.runtime, "streamCaptureModeRelaxed", None)
        pool = cupy.cuda.MemoryPool()
        try:
            with CAPTURE_GATE, stream, cupy.cuda.using_allocator(pool.malloc):
                if relaxed is None:
                    stream.begin_capture()
                else:
                    stream.begin_capture(mode=relaxed)
                # generated kernels launch with PDL while captured, if the plan asks for it
                pdl.state.active = bool(self.backend.pdl)
                try:
                    run_program(plan.program, env)
                finally:
                    pdl.state.active = False
                    graph = stream.end_capture()
        except Exception as exc:  # noqa: BLE001 - any capture failure falls back to launches
            self.enabled = False
            self.status = f"off (capture failed, stream launches: {type(exc).__name__}: {exc})"
            self.fixed_in.clear()
            self.fixed_out.clear()
            plan.pool.release(env)
            return False
        self.graph, self.env, self.capture_pool = graph, env, pool
        pdl_note = ", programmatic dependent launch" if self.backend.pdl else ""
        self.status = f"on ({len(plan.steps)} steps replayed as one graph{pdl_note})"
        return True

    def release(self, plan) -> None:
        """Drop the captured graph and give its arena back to the pool (``release_memory`` then
        frees it); the next call captures again."""
        with self._busy:
            if self.graph is None:
                return
            self.stream.synchronize()  # a replay may still read the arena
            env = self.env
            self.graph = self.env = self.capture_pool = None
            self.fixed_in.clear()
            self.fixed_out.clear()
            self.calls = 1  # warm-up done: the next call captures
            self.status = "pending (captured again on the next call)"
            plan.pool.release(env)

    def _follow_caller(self):
        """Order our stream after the work already queued on the caller's stream."""
        caller = cupy.cuda.get_current_stream()
        self.stream.wait_event(caller.record())
        return caller

    def _replay(self, plan, inputs, out):
        stream = self.stream
        caller = self._follow_caller()
        sp = stream.ptr
        for name, fixed in self.fixed_in.items():
            src = inputs[name]
            cupy.cuda.runtime.memcpyAsync(fixed.data.ptr, src.data.ptr, fixed.nbytes, _D2D, sp)
        self.graph.launch(stream)
        self.replays += 1
        results = {}
        for name, bid in plan.output_ids.items():
            b = plan.buffers[bid]
            arr = out.get(name) if out else None
            if b.role == "output":
                if arr is None:
                    arr = cupy.empty(b.shape, b.dtype)
                fixed = self.fixed_out[name]
                cupy.cuda.runtime.memcpyAsync(arr.data.ptr, fixed.data.ptr, fixed.nbytes, _D2D, sp)
                results[name] = arr
            else:  # an output that is an input or a constant
                with stream:
                    results[name] = self.backend.copy(self.env[bid], arr)
        caller.wait_event(stream.record())
        return results
