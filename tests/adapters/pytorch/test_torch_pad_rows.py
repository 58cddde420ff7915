"""Padding long rows of numbers (audio clips, video frames) row by row gives what padding element by element gives."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip('torch')

import petastorm.pytorch._ragged as ragged  # noqa: E402
from petastorm.columns import ListColumn  # noqa: E402
from petastorm.pytorch._ragged import _long_rows_of_numbers, _pad_rows, pad_list  # noqa: E402


@pytest.mark.parametrize('element_shape', [(), (3,), (2, 2)])
@pytest.mark.parametrize('lengths', [[100, 0, 250, 64], [0, 0], [], [300]])
def test_row_by_row_padding_equals_the_general_padding(element_shape, lengths, monkeypatch):
    rng = np.random.default_rng(len(lengths))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    values = rng.standard_normal((int(offsets[-1]), *element_shape)).astype(np.float32)
    column = ListColumn(np.concatenate([values, values[:5]]) if len(values) else values, offsets)  # spare values
    fast_padded, fast_mask = _pad_rows(column.normalized(), -1.0)
    monkeypatch.setattr(ragged, '_long_rows_of_numbers', lambda _: False)  # the element-by-element padding
    padded, mask = pad_list('x', ListColumn(values, offsets), -1.0)
    assert torch.equal(fast_padded, padded)
    assert torch.equal(fast_mask, mask)
    assert fast_padded.shape == (len(lengths), max(lengths, default=0), *element_shape)


def test_short_rows_keep_the_general_padding():
    assert not _long_rows_of_numbers(ListColumn(np.arange(10), np.array([0, 5, 10])))
    assert _long_rows_of_numbers(ListColumn(np.arange(200.0), np.array([0, 100, 200])))
