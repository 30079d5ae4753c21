"""`tensorlogic run GRAPH.json --batch-size N [--dask [ADDRESS]]`."""

from __future__ import annotations

import numpy as np
import pytest
from pipeline_models import mlp_graph

import tensorlogic as tl
from tensorlogic import cli


@pytest.fixture
def saved(tmp_path):
    g = mlp_graph()
    g.save(tmp_path / "g.json")
    x = np.random.default_rng(5).standard_normal((90, 32)).astype(np.float32)
    np.savez(tmp_path / "in.npz", x=x)
    ref = tl.compile(g, backend="numpy")(x=x)
    return tmp_path, ref


def _run(tmp_path, *extra):
    return cli.main(
        [
            "run",
            str(tmp_path / "g.json"),
            "--inputs",
            str(tmp_path / "in.npz"),
            "--out",
            str(tmp_path / "out.npz"),
            "--backend",
            "numpy",
            *extra,
        ]
    )


def _check(tmp_path, ref):
    with np.load(tmp_path / "out.npz") as z:
        for name in ("y", "s"):
            np.testing.assert_allclose(z[name], ref[name], rtol=1e-5, atol=1e-6)


def test_run_in_batches_on_threads(saved, capsys):
    tmp_path, ref = saved
    assert _run(tmp_path, "--batch-size", "16", "--workers", "2", "--no-progress") == 0
    _check(tmp_path, ref)
    assert "y: shape=(90, 32)" in capsys.readouterr().out


def test_run_on_a_dask_scheduler_address(saved):
    distributed = pytest.importorskip("distributed")
    tmp_path, ref = saved
    with distributed.LocalCluster(
        n_workers=1, threads_per_worker=2, processes=False, dashboard_address=":0"
    ) as cluster:
        assert _run(tmp_path, "--batch-size", "25", "--dask", cluster.scheduler_address) == 0
    _check(tmp_path, ref)


def test_run_on_a_new_local_cluster(saved):
    pytest.importorskip("distributed")
    tmp_path, ref = saved
    assert _run(tmp_path, "--batch-size", "30", "--workers", "1", "--dask") == 0
    _check(tmp_path, ref)


def test_bad_batch_size_is_a_clean_error(saved, capsys):
    tmp_path, _ = saved
    assert _run(tmp_path, "--batch-size", "0") == 2
    assert "batch_size must be an int >= 1" in capsys.readouterr().err
