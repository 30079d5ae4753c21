"""Host copies split over threads give exactly np.copyto's result."""

from __future__ import annotations

import numpy as np
import pytest

from tensorlogic.runtime import hostcopy


@pytest.mark.parametrize("shape, view", [
    ((), None), ((5,), None), ((3, 4), None), ((3000, 2048), None),   # 24 MB: in pieces
    ((3001, 2048), "strided"), ((17, 3, 100_000), None), ((1, 5_000_000), None),
])
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
