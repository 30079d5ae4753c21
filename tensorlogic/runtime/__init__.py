"""What runs a compiled plan, shared by the compiler, the backends and the profiler.

``steps.run_program`` is the one step loop; ``hooks`` is how an observer (the profiler) sees plan
calls and compile-time work; ``pool`` keeps plan arenas across calls; ``fperrors`` silences
numpy's floating-point warnings cheaply; ``hostcopy`` splits large host copies over threads;
``units`` formats byte counts. It imports nothing of the
compiler or the backends, so both may import it.
"""
