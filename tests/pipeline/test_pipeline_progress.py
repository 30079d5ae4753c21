"""The progress bar: drawn in a terminal (checked through a pseudo-terminal), off otherwise."""

from __future__ import annotations

import os
import pty
import subprocess
import sys
import textwrap
import time

import numpy as np
from pipeline_models import mlp_graph

import tensorlogic as tl

SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    sys.path.insert(0, {here!r})
    from pipeline_models import mlp_graph
    import tensorlogic as tl
    plan = tl.compile(mlp_graph(), backend="numpy")
    x = np.random.default_rng(0).standard_normal((250, 32)).astype(np.float32)
    batches = [{{"x": x[i:i + 25]}} for i in range(0, 250, 25)]
    n = sum(1 for _ in tl.run_batches(plan, batches, progress={progress}))
    print("done", n, file=sys.stdout, flush=True)
""")


def _run_in_pty(progress: bool) -> str:
    """Run the script with stderr on a pseudo-terminal; return what the terminal showed."""
    code = SCRIPT.format(here=os.path.dirname(__file__), progress=progress)
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-c", code],
        stdout=slave,
        stderr=slave,
        stdin=subprocess.DEVNULL,
        close_fds=True,
    )
    os.close(slave)
    chunks = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            data = os.read(master, 4096)
        except OSError:  # EIO: the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    proc.wait(timeout=30)
    assert proc.returncode == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


def test_bar_in_a_terminal_shows_batches_and_items_per_second():
    text = _run_in_pty(progress=True)
    assert "done 10" in text
    assert "10/10" in text
    assert "batch/s" in text or "s/batch" in text
    assert "items/s" in text
    assert "\r" in text  # redrawn in place


def test_no_bar_when_progress_false_even_in_a_terminal():
    text = _run_in_pty(progress=False)
    assert "done 10" in text
    assert "items/s" not in text and "10/10" not in text


def test_no_bar_when_stderr_is_not_a_terminal(capsys):
    plan = tl.compile(mlp_graph(), backend="numpy")
    x = np.random.default_rng(1).standard_normal((40, 32)).astype(np.float32)
    res = list(tl.run_batches(plan, [{"x": x[:20]}, {"x": x[20:]}], progress=True))
    assert len(res) == 2
    captured = capsys.readouterr()
    assert captured.err == "" and captured.out == ""


def test_failures_show_in_the_bar_counts():
    from tensorlogic.pipeline.progress import Progress

    with open(os.devnull, "w") as devnull:
        bar = Progress(enabled=True, total=3, file=devnull)
        assert not bar.active  # /dev/null is not a terminal
        bar.update(5)
        bar.update(0, ok=False)
        assert bar.items == 5 and bar.failed == 1
        bar.close()
