"""Batch bounds of run_batched: equal batches, the first and last of each lane cut in pieces."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlogic.pipeline import schedule
from tensorlogic.pipeline.schedule import batch_bounds


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 500),
    batch=st.integers(1, 64),
    lanes=st.integers(0, 4),
    per_item=st.sampled_from([0.0, 1.0, 1e6]),
)
def test_bounds_cover_every_row_once_in_order(n, batch, lanes, per_item):
    bounds = batch_bounds(n, batch, lanes, per_item)
    assert bounds[0][0] == 0 and bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    assert all(0 < hi - lo <= batch for lo, hi in bounds) or n == 0
    plain = batch_bounds(n, batch)
    assert len(plain) == max(1, -(-n // batch))
    if lanes == 0 or batch * per_item < schedule.SPLIT_MIN_BYTES:
        assert bounds == plain
    else:  # only the first and last `lanes` batches are cut, each into SPLIT_ENDS pieces
        cut = {k for k in range(len(plain)) if k < lanes or k >= len(plain) - lanes}
        assert len(bounds) == len(plain) + sum(
            max(1, min(schedule.SPLIT_ENDS, plain[k][1] - plain[k][0])) - 1 for k in cut
        )
        middle = [b for k, b in enumerate(plain) if k not in cut]
        assert all(b in bounds for b in middle)


def test_large_batches_on_two_lanes():
    mb = 1 << 20
    assert batch_bounds(10, 4, 2, mb) == [(0, 2), (2, 4), (4, 6), (6, 8), (8, 9), (9, 10)]
    assert batch_bounds(24, 4, 2, mb) == [
        (0, 2), (2, 4), (4, 6), (6, 8), (8, 12), (12, 16),
        (16, 18), (18, 20), (20, 22), (22, 24),
    ]  # fmt: skip
    assert batch_bounds(24, 4, 2, 1.0) == [(k, k + 4) for k in range(0, 24, 4)]


@pytest.mark.parametrize("parts", [1, 3])
def test_split_ends_setting(monkeypatch, parts):
    monkeypatch.setattr(schedule, "SPLIT_ENDS", parts)
    bounds = batch_bounds(12, 6, 1, 1e9)
    assert bounds == (
        [(0, 6), (6, 12)] if parts == 1 else [(0, 2), (2, 4), (4, 6), (6, 8), (8, 10), (10, 12)]
    )
