"""Host copies split over threads give exactly np.copyto's result."""

from __future__ import annotations

import numpy as np
import pytest

from tensorlogic.runtime import hostcopy


@pytest.mark.parametrize(
    "shape, view",
    [
        ((), None),
        ((5,), None),
        ((3, 4), None),
        ((3000, 2048), None),  # 24 MB: in pieces
        ((3001, 2048), "strided"),
        ((17, 3, 100_000), None),
        ((1, 5_000_000), None),
    ],
)
def test_copyto_equals_numpy(rng, shape, view):
    src = rng.standard_normal(shape).astype(np.float32)
    if view == "strided":  # a non-contiguous source (every other column)
        src = np.ascontiguousarray(np.repeat(src, 2, axis=1))[:, ::2]
    dst = np.full(src.shape, np.nan, np.float32)
    hostcopy.copyto(dst, src)
    np.testing.assert_array_equal(dst, src)


def test_copyto_checks_shapes():
    with pytest.raises(ValueError, match="differ"):
        hostcopy.copyto(np.empty((3, 2)), np.empty((2, 3)))


@pytest.mark.parametrize("shape", [(), (0, 5), (3,), (2048, 1024), (1000, 7, 33)])
def test_copy_in_pieces_yields_every_row_once_in_order(shape):
    src = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    dst = np.empty_like(src)
    got = list(hostcopy.copy_in_pieces(dst, src))
    assert np.array_equal(dst, src)
    if src.ndim:
        assert got[0][0] == 0 and got[-1][1] == shape[0]
        assert all(a[1] == b[0] for a, b in zip(got, got[1:]))
        if src.nbytes >= 2 * hostcopy.STREAM_PIECE_BYTES:
            assert len(got) > 1


def test_copy_in_pieces_from_a_strided_source():
    src = np.random.default_rng(2).standard_normal((2048, 2048)).astype(np.float32)[:, ::2]
    dst = np.empty(src.shape, src.dtype)
    list(hostcopy.copy_in_pieces(dst, src))
    assert np.array_equal(dst, src)


def test_copy_landed_waits_for_each_piece_before_copying_it():
    src = np.random.default_rng(3).standard_normal((2048, 1024)).astype(np.float32)
    dst = np.empty_like(src)
    waited = []

    class Event:
        def __init__(self, k):
            self.k = k

        def synchronize(self):
            waited.append(self.k)

    pieces = [(lo, hi, Event(k)) for k, (lo, hi) in enumerate(hostcopy.row_pieces(src))]
    assert len(pieces) > 1
    hostcopy.copy_landed(dst, src, pieces)
    assert waited == list(range(len(pieces)))
    assert np.array_equal(dst, src)
