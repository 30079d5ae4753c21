"""tl.train on hand-written gradient graphs (least squares): convergence, checkpoints and
resume, on_error, check_finite, the progress bar, and bad calls."""

from __future__ import annotations

import io

import numpy as np
import pytest

import tensorlogic as tl
from tensorlogic.pipeline.progress import Progress

B, D = 8, 5


def least_squares(rng, w0=None):
    """loss = mean((x w + c - y)^2) with its gradients written out by hand."""
    g = tl.EinsumGraph()
    x = g.input("x", (B, D), "float64")
    y = g.input("y", (B,), "float64")
    w = g.parameter("w", rng.standard_normal(D) if w0 is None else w0)
    c = g.parameter("c", np.zeros(()))
    r = g.einsum("bi,i->b", x, w) + c - y
    g.output(g.mean(r * r), name="loss")
    g.output(g.einsum("bi,b->i", x, r) * (2.0 / B), name="grad_w")
    g.output(g.sum(r) * (2.0 / B), name="grad_c")
    return g


def data(rng, n_batches, true_w, noise=0.01):
    out = []
    for _ in range(n_batches):
        x = rng.standard_normal((B, D))
        out.append({"x": x, "y": x @ true_w + 0.5 + noise * rng.standard_normal(B)})
    return out


@pytest.mark.parametrize(
    "make", [lambda: tl.optim.SGD(lr=0.1, momentum=0.5), lambda: tl.optim.Adam(lr=0.05)]
)
def test_training_recovers_the_weights(backend, make, rng):
    true_w = rng.standard_normal(D)
    g = least_squares(rng)
    batches = data(rng, 20, true_w)
    hist = tl.train(g, batches, epochs=15, optimizer=make(), backend=backend, progress=False)
    assert hist.steps == 300 and len(hist.epoch_losses) == 15
    assert hist.epoch_losses[-1] < 1e-2 * hist.epoch_losses[0]
    w = np.asarray(
        hist.plan.parameters["w"].get() if backend == "cupy" else hist.plan.parameters["w"]
    )
    np.testing.assert_allclose(w, true_w, atol=0.05)
    np.testing.assert_allclose(float(hist.plan.parameters["c"]), 0.5, atol=0.05)


def test_each_step_sees_the_previous_update(rng):
    """Prefetching reads batches ahead but the steps run in order: the history equals a
    hand-written loop of plan call + optimizer step."""
    g = least_squares(rng)
    batches = data(rng, 6, rng.standard_normal(D))
    hist = tl.train(
        g,
        batches,
        epochs=2,
        optimizer=tl.optim.SGD(lr=0.1),
        backend="numpy",
        prefetch=3,
        progress=False,
    )
    plan = tl.compile(g, backend="numpy", cache=False)
    opt, losses = tl.optim.SGD(lr=0.1), []
    for _ in range(2):
        for b in batches:
            out = plan(b)
            losses.append(float(out["loss"]))
            opt.step(plan, out)
    assert hist.losses == losses
    np.testing.assert_array_equal(hist.plan.parameters["w"], plan.parameters["w"])


class Interrupt(Exception):
    pass


def test_resume_gives_the_uninterrupted_result(tmp_path, rng):
    g = least_squares(rng)
    batches = data(rng, 7, rng.standard_normal(D))
    full = tl.train(
        tl.compile(g, backend="numpy", cache=False),
        batches,
        epochs=3,
        optimizer=tl.optim.Adam(lr=0.05, weight_decay=0.01),
        progress=False,
    )
    ck = tmp_path / "run.ckpt"
    stop = {"epoch": 1, "batch": 5}

    def flaky(epoch):
        for k, b in enumerate(batches):
            if stop and (epoch, k) == (stop["epoch"], stop["batch"]):
                raise Interrupt("killed")
            yield b

    plan = tl.compile(g, backend="numpy", cache=False)
    with pytest.raises(tl.BatchError, match="Interrupt"):
        tl.train(
            plan,
            flaky,
            epochs=3,
            optimizer=tl.optim.Adam(lr=0.05, weight_decay=0.01),
            checkpoint=ck,
            checkpoint_every=2,
            progress=False,
        )
    stop.clear()
    fresh = tl.compile(g, backend="numpy", cache=False)  # a new process would start here
    resumed = tl.train(
        fresh,
        flaky,
        epochs=3,
        optimizer=tl.optim.Adam(lr=0.05, weight_decay=0.01),
        checkpoint=ck,
        resume=True,
        progress=False,
    )
    assert resumed.losses == full.losses
    assert resumed.epoch_losses == full.epoch_losses
    for k in ("w", "c"):
        np.testing.assert_array_equal(fresh.parameters[k], full.plan.parameters[k])
    # a finished run resumes to nothing more
    again = tl.train(
        fresh,
        batches,
        epochs=3,
        optimizer=tl.optim.Adam(lr=0.05),
        checkpoint=ck,
        resume=True,
        progress=False,
    )
    assert again.losses == full.losses


def test_checkpoint_errors_change_nothing(tmp_path, rng):
    g = least_squares(rng)
    plan = tl.compile(g, backend="numpy", cache=False)
    ck = tmp_path / "a.ckpt"
    tl.train(
        plan,
        data(rng, 2, np.ones(D)),
        optimizer=tl.optim.SGD(lr=0.1, momentum=0.9),
        checkpoint=ck,
        progress=False,
    )
    other = tl.compile(
        least_squares(rng, np.ones(D, np.float64)).copy(), backend="numpy", cache=False
    )
    before = np.array(other.parameters["w"])
    with pytest.raises(tl.SerializationError, match="state of a Adam, got SGD"):
        tl.train(
            other,
            data(rng, 1, np.ones(D)),
            optimizer=tl.optim.Adam(),
            checkpoint=ck,
            resume=True,
            progress=False,
        )
    np.testing.assert_array_equal(other.parameters["w"], before)
    (tmp_path / "junk.ckpt").write_bytes(b"not a zip")
    with pytest.raises(tl.SerializationError):
        tl.train(
            other,
            data(rng, 1, np.ones(D)),
            optimizer=tl.optim.Adam(),
            checkpoint=tmp_path / "junk.ckpt",
            resume=True,
            progress=False,
        )


def test_bad_batches_are_skipped_or_raised(rng):
    g = least_squares(rng)
    good = data(rng, 4, np.ones(D))
    bad_shape = {"x": np.ones((B, D + 1)), "y": np.ones(B)}
    nan = {"x": np.full((B, D), np.nan), "y": np.ones(B)}
    batches = [good[0], bad_shape, good[1], nan, good[2], good[3]]
    skipped = tl.train(
        g,
        batches,
        optimizer=tl.optim.SGD(lr=0.1),
        backend="numpy",
        on_error="skip",
        check_finite=True,
        progress=False,
    )
    assert skipped.skipped == [(0, 1), (0, 3)] and skipped.steps == 4
    clean = tl.train(g, good, optimizer=tl.optim.SGD(lr=0.1), backend="numpy", progress=False)
    assert skipped.losses == clean.losses
    with pytest.raises(tl.BatchError, match="batch 1") as info:
        tl.train(g, batches, optimizer=tl.optim.SGD(lr=0.1), backend="numpy", progress=False)
    assert info.value.index == 1
    # a non-finite loss is a failed step under check_finite: no update
    huge = {"x": np.full((B, D), 1e200), "y": np.ones(B)}
    plan = tl.compile(g, backend="numpy", cache=False)
    w = np.array(plan.parameters["w"])
    hist = tl.train(
        plan,
        [huge],
        optimizer=tl.optim.SGD(lr=0.1),
        check_finite=True,
        on_error="skip",
        progress=False,
    )
    assert hist.skipped == [(0, 0)]
    np.testing.assert_array_equal(plan.parameters["w"], w)


def test_bad_calls(rng, tmp_path):
    g = least_squares(rng)
    opt = tl.optim.SGD(lr=0.1)
    batches = data(rng, 2, np.ones(D))
    cases = [
        (dict(optimizer="adam"), tl.InputError, "tl.optim optimizer"),
        (dict(optimizer=opt, epochs=0), tl.InputError, "epochs must be"),
        (dict(optimizer=opt, on_error="ignore"), tl.InputError, "on_error"),
        (dict(optimizer=opt, resume=True), tl.InputError, "checkpoint="),
        (dict(optimizer=opt, loss="nope"), tl.GraphError, "no output 'nope'"),
        (dict(optimizer=opt, loss="grad_w"), tl.GraphError, "must be a scalar"),
    ]
    for kw, err, match in cases:
        with pytest.raises(err, match=match):
            tl.train(g, batches, progress=False, backend="numpy", **kw)
    with pytest.raises(tl.InputError, match="one-shot iterator"):
        tl.train(g, iter(batches), optimizer=opt, epochs=2, progress=False)
    with pytest.raises(tl.InputError, match="iterable of input dicts"):
        tl.train(g, batches[0], optimizer=opt, progress=False)
    no_grads = tl.EinsumGraph()
    x = no_grads.input("x", (3,))
    no_grads.output(no_grads.sum(x * no_grads.parameter("p", np.ones(3, np.float32))), name="loss")
    with pytest.raises(tl.GraphError, match="grad_<parameter>"):
        tl.train(
            tl.compile(no_grads, backend="numpy"),
            [{"x": np.ones(3, np.float32)}],
            optimizer=opt,
            progress=False,
        )
    with pytest.raises(tl.GraphError, match="CompiledPlan or an EinsumGraph"):
        tl.train("model", batches, optimizer=opt)


class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_bar_shows_the_loss():
    out = _Terminal()
    bar = Progress(True, 2, file=out, desc="epoch 1/1")
    bar.note = "loss 0.125"
    bar.update(8)
    bar.update(8)
    bar.close()
    assert "loss 0.125" in out.getvalue() and "epoch 1/1" in out.getvalue()


def test_a_graph_without_gradient_outputs_gets_them_from_grad(rng):
    """tl.train(graph) differentiates the loss with respect to every parameter itself."""
    g = least_squares(rng)
    for name in ("grad_w", "grad_c"):
        del g.outputs[name]
    batches = data(rng, 5, rng.standard_normal(D))
    auto = tl.train(
        g, batches, epochs=3, optimizer=tl.optim.SGD(lr=0.1), backend="numpy", progress=False
    )
    assert {"grad_w", "grad_c"} <= set(auto.plan.output_names)
    by_hand = tl.train(
        least_squares(np.random.default_rng(0), g.parameter_value("w")),
        batches,
        epochs=3,
        optimizer=tl.optim.SGD(lr=0.1),
        backend="numpy",
        progress=False,
    )
    np.testing.assert_allclose(auto.losses, by_hand.losses, rtol=1e-12)
    no_params = tl.EinsumGraph()
    no_params.output(no_params.sum(no_params.input("x", (3,), "float64")), name="loss")
    with pytest.raises(tl.GraphError, match="no grad_<parameter> outputs"):
        tl.train(no_params, [{"x": np.ones(3)}], optimizer=tl.optim.SGD(lr=0.1))
