"""Compile options: one registry of every option ``tl.compile`` takes, checked before compiling.

Each option is declared once with its accepted values, its default and the backends it is for
(none: every backend). ``CompileOptions.resolve`` checks what the caller passed against the
registry: an unknown name or a value of the wrong kind raises GraphError naming the option and
what is accepted. An option meant for a backend other than the one compiled for is accepted and
ignored (``CompileOptions.ignored``; ``print(plan)`` lists it), so one call works under
``backend="auto"`` on any machine. Adding an option is one ``register_option(...)`` line.
"""

from __future__ import annotations

import difflib
import numbers
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Callable

from .errors import GraphError


@dataclass(frozen=True)
class Option:
    """One compile option.

    Args:
        name: the keyword of ``tl.compile``.
        normalize: returns the canonical value, or raises ValueError/TypeError for a bad one.
        expected: what is accepted, in words (used in error messages).
        default: the value when the option is not given.
        doc: one line on what it does.
        backends: names of the backends that read it; empty for compiler/optimizer options that
            apply to every backend.
    """

    name: str
    normalize: Callable[[Any], Any]
    expected: str
    default: Any
    doc: str
    backends: tuple[str, ...] = ()


OPTIONS: dict[str, Option] = {}


def register_option(option: Option, *, replace: bool = False) -> Option:
    """Add ``option`` to the registry (a backend outside this package registers its own)."""
    if not option.name.isidentifier():
        raise GraphError(f"option name must be an identifier, got {option.name!r}")
    if option.name in OPTIONS and not replace:
        raise GraphError(f"a compile option named {option.name!r} is already registered")
    OPTIONS[option.name] = option
    return option


# ----------------------------------------------------------------------------- value kinds
def flag(v: Any) -> bool:
    """True or False exactly: truthy strings and numbers are refused, not guessed."""
    if isinstance(v, bool):
        return v
    raise TypeError(v)


def flag_or_names(v: Any) -> bool | tuple[str, ...]:
    """True, False, or a list/tuple/set of names (canonical: a sorted tuple; what the names
    must be is checked by the option's reader)."""
    if isinstance(v, bool):
        return v
    if isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(x, str) for x in v):
        return tuple(sorted(set(v)))
    raise TypeError(v)


def auto_flag_or_names(v: Any) -> bool | str | tuple[str, ...]:
    """``flag_or_names``, or the string "auto"."""
    return "auto" if isinstance(v, str) and v == "auto" else flag_or_names(v)


def one_of(*choices: Any) -> Callable[[Any], Any]:
    """A value equal to one of ``choices`` and of the same type (so 1 is not True)."""

    def check(v: Any) -> Any:
        for c in choices:
            if type(v) is type(c) and v == c:
                return c
        raise ValueError(v)

    return check


def positive_int(v: Any) -> int:
    """A positive integer (bools refused)."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) > 0:
        return int(v)
    raise ValueError(v)


def count(v: Any) -> int:
    """A non-negative integer (bools refused)."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool) and int(v) >= 0:
        return int(v)
    raise ValueError(v)


def function(v: Any) -> Any:
    """A callable."""
    if callable(v):
        return v
    raise TypeError(v)


def optional(kind: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``kind`` or None."""
    return lambda v: None if v is None else kind(v)


def _add(
    name: str, normalize, expected: str, default: Any, doc: str, backends: tuple[str, ...] = ()
) -> None:
    register_option(Option(name, normalize, expected, default, doc, backends))


# ----------------------------------------------------------------------------- the registry
_BYTES = "a positive number of bytes or None"
# compiler and optimizer: every backend
_add(
    "memory_limit",
    optional(positive_int),
    _BYTES,
    None,
    "bytes one call may need (intermediates plus outputs); default: the device's free memory",
)
_add("pool", flag, "True or False", True, "keep buffer arenas across calls")
_add("reuse_memory", flag, "True or False", True, "let intermediates share memory")
_add(
    "recompute",
    flag,
    "True or False",
    True,
    "recompute cheap functions of inputs and constants for far-apart users instead of keeping them",
)
_add(
    "path_memory_limit",
    optional(positive_int),
    _BYTES,
    None,
    "largest intermediate a contraction path may build (default: memory_limit)",
)
_add("assume_finite", flag, "True or False", False, "inputs hold no inf/NaN, so x*0 may fold to 0")
_add(
    "fuse_attention",
    auto_flag_or_names,
    "True, False, 'auto' or a list of dtype names",
    "auto",
    "rewrite attention written out with einsums to one attention node (O2); 'auto' fuses where "
    "the written-out scores would be large (optimizer.attention.AUTO_MIN_SCORE_BYTES); a list "
    "fuses only attentions of those dtypes. Default: 'auto' on host backends; on a device "
    "backend the dtypes whose fused kernel measured faster than the written-out form "
    "(Capabilities.fused_attention)",
)
_add(
    "attention_layout",
    flag_or_names,
    "True, False or a list of dtype names",
    False,
    "let attention nodes read and write the layouts their neighbour einsums produce without "
    "copies, e.g. (B, S, H, D) from a head-splitting projection (O2, "
    "optimizer.attention_layout); a list: only attentions of those dtypes. Default: the dtypes "
    "whose attention kernel reads strided layouts (Capabilities.attention_layouts), else False",
)
_add(
    "precision",
    one_of(None, "float32", "fp32", "bf16", "bfloat16", "fp16", "float16"),
    "None, 'float32', 'bf16' or 'fp16'",
    None,
    "run a float32 graph in a 16-bit dtype, float32 at the boundary (optimizer.precision)",
)
_add(
    "matmul_precision",
    one_of("highest", "tf32"),
    "'highest' or 'tf32'",
    "highest",
    "float32 contractions: exact, or TF32 tensor cores where the backend has them (GPU)",
)
_add(
    "fold_evaluator",
    optional(function),
    "a function evaluate(node, arrays) or None",
    None,
    "evaluates constant subgraphs when folding (default: tensorlogic.ir.evaluate)",
)


# O3 autotuning (compiler/autotune.py) and the optimizer's pipeline
def _seconds(v: Any) -> float:
    if isinstance(v, numbers.Real) and not isinstance(v, bool) and float(v) >= 0:
        return float(v)
    raise ValueError(v)


def _names(v: Any) -> tuple[str, ...]:
    items = (v,) if isinstance(v, str) else v
    if not isinstance(items, (list, tuple, set, frozenset)) or not all(
        isinstance(x, str) for x in items
    ):
        raise TypeError(v)
    return tuple(items)


#: optimizer pass names, filled in by ``optimizer.base.register_pass`` (options sit below the
#: optimizer, so the optimizer tells them its names)
PASS_NAMES: set[str] = set()


def _pass_names(v: Any) -> tuple[str, ...]:
    names = _names(v)
    if any(n not in PASS_NAMES for n in names):
        raise ValueError(v)
    return names


_add(
    "skip_passes",
    _pass_names,
    "a list of optimizer pass names (tensorlogic.optimizer.base.PASSES)",
    (),
    "passes left out of the opt level's pipeline",
)
_add(
    "autotune_budget",
    _seconds,
    "a number of seconds >= 0",
    10.0,
    "O3: seconds the autotuner may spend per plan, compile time included",
)
_add(
    "autotune_cache",
    flag,
    "True or False",
    True,
    "O3: keep the autotuner's decision on disk under TL_CACHE_DIR/autotune",
)
_add(
    "autotune_timer",
    optional(function),
    "None or a callable timer(label, run) -> seconds",
    None,
    "O3: replaces the measurement of each candidate (deterministic tests)",
)
_add(
    "autotune_backends",
    optional(_names),
    "None or a list of backend names",
    None,
    "O3: backends to choose from (default: the compiled one; auto on a CPU: numba and numpy)",
)
# numpy and numba
_add(
    "threads",
    one_of("pool", "blas"),
    "'pool' or 'blas'",
    "pool",
    "CPU threads: GEMMs split over our threads with single-threaded BLAS (pool) or BLAS's own "
    "threads (blas)",
    ("numpy", "numba"),
)
# numba
_add(
    "fast_math",
    flag,
    "True or False",
    True,
    "vectorizable exp/log (2-4 ulp) and reassociated sums",
    ("numba",),
)
_add(
    "parallel_threshold",
    optional(count),
    "an int >= 0 or None",
    None,
    "elements from which a kernel runs in parallel (None: the backend's default)",
    ("numba",),
)
# cupy
_add(
    "codegen",
    one_of("ptx", "cuda"),
    "'ptx' or 'cuda'",
    "ptx",
    "kernels as PTX from our emitter or CUDA C through NVRTC",
    ("cupy",),
)
_add(
    "cuda_graph",
    one_of("auto", True, False),
    "'auto', True or False",
    "auto",
    "capture the plan as a CUDA graph (auto: when launches dominate)",
    ("cupy",),
)
_add(
    "pdl",
    flag,
    "True or False",
    False,
    "programmatic dependent launch inside captured graphs (compute capability 9.0+)",
    ("cupy",),
)


# ----------------------------------------------------------------------------- resolved options
class CompileOptions(Mapping[str, Any]):
    """The validated options of one plan: a read-only mapping of every registered option.

    ``opts[name]`` is the given value or the option's default. ``given`` holds what the caller
    passed (canonical values), ``ignored`` the given options meant for other backends, and
    ``key`` a normalized tuple for the plan cache (a default passed explicitly or left out
    gives the same key).
    """

    __slots__ = ("_values", "given", "ignored", "key")

    def __init__(
        self, values: dict[str, Any], given: dict[str, Any], ignored: tuple[str, ...]
    ) -> None:
        object.__setattr__(self, "_values", dict(values))
        object.__setattr__(self, "given", MappingProxyType(dict(given)))
        object.__setattr__(self, "ignored", ignored)
        used = tuple(sorted((k, repr(v)) for k, v in values.items()))
        object.__setattr__(self, "key", used + tuple((k, repr(given[k])) for k in ignored))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("CompileOptions is read-only")

    @classmethod
    def resolve(
        cls,
        options: Mapping[str, Any],
        backend: str = "",
        accepted: tuple[str, ...] | frozenset[str] | None = None,
    ) -> CompileOptions:
        """Check ``options`` against the registry for ``backend``.

        Args:
            options: the keyword options as passed to ``tl.compile``.
            backend: the backend's name (for messages and for ``Option.backends``).
            accepted: the backend-specific options the backend takes (its capabilities);
                None takes those whose ``Option.backends`` names ``backend``.
        Raises:
            GraphError: unknown option, or a value of the wrong kind.
        """
        given: dict[str, Any] = {}
        for name, value in options.items():
            opt = OPTIONS.get(name)
            if opt is None:
                close = difflib.get_close_matches(name, OPTIONS, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                raise GraphError(
                    f"unknown compile option {name!r}{hint}; accepted options are {sorted(OPTIONS)}"
                )
            try:
                given[name] = opt.normalize(value)
            except (TypeError, ValueError):
                raise GraphError(
                    f"compile option {name} must be {opt.expected}, got {value!r} "
                    f"({type(value).__name__})"
                ) from None
        ignored = []
        values = {}
        for name, opt in OPTIONS.items():
            applies = not opt.backends or (
                name in accepted if accepted is not None else backend in opt.backends
            )
            if applies:
                values[name] = given.get(name, opt.default)
            elif name in given:
                ignored.append(name)
        return cls(values, given, tuple(ignored))

    def __getitem__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            opt = OPTIONS.get(name)
            if opt is None:
                raise
            return opt.default  # an option of another backend reads as its default

    def __contains__(self, name: object) -> bool:
        return name in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CompileOptions):
            return self.key == other.key
        return NotImplemented

    def describe_ignored(self, backend: str) -> str:
        """One line naming the ignored options and their backends ('' when none)."""
        if not self.ignored:
            return ""
        parts = [
            f"{k}={self.given[k]!r} (for {'/'.join(OPTIONS[k].backends)})" for k in self.ignored
        ]
        return f"options ignored by {backend}: {', '.join(parts)}"

    def __repr__(self) -> str:
        return f"CompileOptions({dict(self.given)!r})"


__all__ = [
    "OPTIONS",
    "CompileOptions",
    "Option",
    "register_option",
    "flag",
    "one_of",
    "positive_int",
    "count",
    "function",
    "optional",
]
