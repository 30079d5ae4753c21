"""Where each batch of ``run_batched`` starts and ends.

Batches are equal (the last one maybe smaller), except on device lanes (pipeline/devices.py):
there a lane's first batch can only start computing once all of it has been copied to the
device, and its last batch's results only land once all of them have been copied back, and no
other work hides those two copies. So the first and the last batch of each lane are cut into
``SPLIT_ENDS`` pieces: the first piece computes while the next is copied in, the last piece's
results are the only ones left to copy out after the device is done.
"""

from __future__ import annotations

SPLIT_ENDS = 2  # pieces the first and the last batch of each lane are cut into
# a batch moving less than this (inputs plus outputs) copies in well under a millisecond:
# too little to hide to be worth an extra batch size (one more plan specialization)
SPLIT_MIN_BYTES = 4 << 20


def batch_bounds(
    n: int, batch_size: int, lanes: int = 0, bytes_per_item: float = 0.0
) -> list[tuple[int, int]]:
    """Row ranges ``(lo, hi)`` covering ``0..n`` in order: batches of ``batch_size``, with the
    first and last ``lanes`` of them cut into ``SPLIT_ENDS`` pieces when each moves at least
    ``SPLIT_MIN_BYTES`` (``lanes=0``: no cuts). ``n=0`` gives one empty batch."""
    plain = [(lo, min(n, lo + batch_size)) for lo in range(0, n, batch_size)] or [(0, 0)]
    if lanes < 1 or SPLIT_ENDS < 2 or batch_size * bytes_per_item < SPLIT_MIN_BYTES:
        return plain
    ends = set(range(min(lanes, len(plain))))
    ends |= set(range(max(0, len(plain) - lanes), len(plain)))
    bounds: list[tuple[int, int]] = []
    for k, (lo, hi) in enumerate(plain):
        parts = SPLIT_ENDS if k in ends and hi - lo >= SPLIT_ENDS else 1
        cuts = [lo + (hi - lo) * j // parts for j in range(parts + 1)]
        bounds += zip(cuts[:-1], cuts[1:])
    return bounds


__all__ = ["SPLIT_ENDS", "SPLIT_MIN_BYTES", "batch_bounds"]
