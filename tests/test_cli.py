"""The command line: demo and run."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

import tensorlogic as tl
from tensorlogic import cli


def test_demo_runs_and_checks_itself(capsys):
    assert cli.main(["demo", "--repeat", "2", "--backend", "numpy"]) == 0
    out = capsys.readouterr().out
    assert "OK" in out and "CompiledPlan" in out and "median call" in out
    # compared with what a user would otherwise run: numpy's optimized einsum, torch if present
    assert "numpy (einsum optimize=True)" in out
    assert "torch eager:" in out or "torch: not installed" in out


def test_demo_without_torch(capsys, monkeypatch):
    import builtins

    real = builtins.__import__

    def no_torch(name, *args, **kwargs):
        if name == "torch" or name.startswith("torch."):
            raise ImportError("no torch here")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_torch)
    assert cli.main(["demo", "--repeat", "2", "--backend", "numpy"]) == 0
    assert "torch: not installed" in capsys.readouterr().out


def test_run_saved_graph(tmp_path, capsys):
    g = tl.EinsumGraph()
    x = g.input("x", ("B", 3))
    g.output(g.softmax(x * 2.0, -1), name="p")
    g.save(tmp_path / "g.json")
    xv = np.random.default_rng(1).standard_normal((4, 3)).astype("float32")
    np.savez(tmp_path / "in.npz", x=xv)
    rc = cli.main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--out",
            str(tmp_path / "out.npz"),
            "--backend",
            "numpy",
            "--opt-level",
            "1",
        ]
    )
    assert rc == 0
    with np.load(tmp_path / "out.npz") as z:
        e = np.exp(2 * xv - (2 * xv).max(-1, keepdims=True))
        np.testing.assert_allclose(z["p"], e / e.sum(-1, keepdims=True), rtol=1e-6)


def test_run_reports_errors_cleanly(tmp_path, capsys):
    (tmp_path / "bad.json").write_text("{}")
    assert cli.main(["run", str(tmp_path / "bad.json")]) == 2
    assert "error" in capsys.readouterr().err


def test_console_script_entry_point():
    res = subprocess.run(
        [sys.executable, "-m", "tensorlogic.cli", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0 and "demo" in res.stdout
