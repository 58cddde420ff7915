"""Counting up from 0 at every start of a flat array: the positions of the segments of a packed token row.

The token loader's ``position_ids`` are such ramps, one per document piece in a row. The compiled kernel writes
them in one pass over the output; without it, numpy's running sum of ones reset at every start gives the same
values in three (a fill, a scatter, the sum).
"""

from __future__ import annotations

import numpy as np

from petastorm.shuffle._compiled import kernel_in_use

__all__ = ['ramps']


def ramps(out: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Fill ``out`` (a contiguous int64 array, any shape, read flat) so that it counts up from 0 at every start.

    Args:
        out: the array to fill.
        starts: where each ramp starts in ``out`` read flat: int64, ascending, the first one 0.

    Returns:
        ``out``.
    """
    flat = out.reshape(-1)
    if not len(flat):
        return out
    kernel = kernel_in_use()
    if kernel is not None and len(starts) and starts[0] == 0 and starts.dtype == np.int64 and starts.flags.c_contiguous:
        kernel.ramps(flat, starts)
        return out
    sizes = np.diff(starts, append=len(flat))
    flat.fill(1)
    flat[starts[1:]] = 1 - sizes[:-1]
    flat[0] = 0
    np.cumsum(flat, out=flat)
    return out
