"""Dependencies point one way, along the data flow: ir <- optimizer <- compiler, backends see the
IR and the plan's data types, runtime and options sit below both, profiler and pipeline on top.
Every import in the package (module level or inside a function) is checked."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "tensorlogic"
BASE = {"errors", "config", "dtypes", "runtime", "options"}
# what each layer may import from the package (besides itself)
ALLOWED = {
    "ir": {"errors", "config", "dtypes"},
    "runtime": {"errors", "config"},
    "options": {"errors"},
    "optimizer": BASE | {"ir"},
    "autodiff": {"errors", "config", "dtypes", "ir"},
    "backends": BASE | {"ir"},
    "compiler": BASE | {"ir", "optimizer", "backends"},
    # learning: optimizers compile their update kernels; the loop sits on the pipeline
    "optim": BASE | {"ir", "compiler"},
    "learn": BASE | {"ir", "compiler", "pipeline", "optim", "autodiff"},
}
# known exceptions, each with its reason (none left)
EXCEPTIONS: dict[tuple[str, str], set[str]] = {}


def _imports(path: Path) -> list[str]:
    """Absolute tensorlogic modules imported by ``path``."""
    pkg = path.relative_to(ROOT.parent).with_suffix("").parts[:-1]
    if path.name == "__init__.py":
        pkg = path.relative_to(ROOT.parent).parts[:-1]
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(pkg[: len(pkg) - node.level + 1])
                mod = ".".join(base + ([node.module] if node.module else []))
                names = [mod] if node.module else [f"{mod}.{a.name}" for a in node.names]
            else:
                names = [node.module or ""]
            out.extend(n for n in names if n.startswith("tensorlogic"))
        elif isinstance(node, ast.Import):
            out.extend(a.name for a in node.names if a.name.startswith("tensorlogic"))
    return out


def _layer(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_layer_imports_only_what_is_below(layer):
    files = (
        sorted((ROOT / layer).rglob("*.py")) if (ROOT / layer).is_dir() else [ROOT / f"{layer}.py"]
    )
    bad = []
    for f in files:
        rel = str(f.relative_to(ROOT.parent))
        for mod in _imports(f):
            target = _layer(mod)
            if target in ("", layer) or target in ALLOWED[layer]:
                continue
            if rel in EXCEPTIONS.get((layer, target), set()):
                continue
            bad.append(f"{rel} imports {mod}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_relative_imports():
    # a guard against a checker that passes because it finds nothing
    found = _imports(ROOT / "compiler" / "compile.py")
    assert "tensorlogic.optimizer" in found and "tensorlogic.runtime" in found
    assert any(m.startswith("tensorlogic.backends") for m in found)
