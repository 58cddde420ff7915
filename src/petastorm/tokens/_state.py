"""Saved positions of a token loader: their checks, and what ranks of another world size make of them.

A position is a dict of plain ints and lists (it fits JSON, ``torch.save`` and Grain's checkpoints)::

    {'format': 'petastorm.tokens', 'version': 1, 'seq_len', 'packing', 'bos_id', 'eos_id',
     'shard', 'shard_count', 'passes_done', 'in_progress', 'steps', 'total_steps', 'draws', 'picks', 'generation',
     'tokens': [per source], 'padding', 'rows': [[source, document, start, length, ...] per buffered row],
     'sources': [{'reader', 'remaining', 'packer'} per source]}

In a ``torch.distributed`` run a loader saves ``{'format', 'version', 'ranks': [every rank's position]}``.

:func:`own_state` finds the one a rank continues exactly (same world size). Otherwise every rank continues from all
of them (:func:`merged_ranges`): the readers split the documents no rank delivered again, and what is left of
each partly delivered document is known by its ranges. A document is named by every rank that holds part of it
and, after an earlier restore on another world size, by ranks that only know it was partly delivered then; the
ranges of a rank that received it are within those, so the ranges left are what all of them name in common. A
document a rank lists as ``'delivered'`` (held by its reader's position, all of it handed out since) is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from petastorm.tokens._feed import listed_ranges, ranges_of_entries
from petastorm.tokens._held import merged_runs
from petastorm.tokens._options import TokenOptions
from petastorm.tokens._queue import Ranges

__all__ = ['FORMAT', 'VERSION', 'check_states', 'intersect', 'merged_delivered', 'merged_ranges', 'own_state',
           'rank_states']

FORMAT = 'petastorm.tokens'
VERSION = 1


def rank_states(state: Any) -> list[dict[str, Any]]:
    """The positions a saved state holds: every rank's (a gathered state), or the one.

    Raises:
        ValueError: not a token loader's position.
    """
    if not isinstance(state, dict) or state.get('format') != FORMAT or state.get('version') != VERSION:
        raise ValueError(f'not a position saved by a petastorm.tokens loader (format {FORMAT!r}, version {VERSION}): '
                         f'{state!r:.200}')
    ranks = state.get('ranks')
    if ranks is None:
        return [state]
    if not ranks:
        raise ValueError('the saved position holds an empty list of ranks')
    return sorted(ranks, key=lambda one: int(one['shard']))


def check_states(states: Sequence[dict[str, Any]], options: TokenOptions, sources: int) -> None:
    """Refuse positions saved by a loader of other packing or sources; the message names the difference.

    Raises:
        ValueError: naming the argument that differs.
    """
    pack = options.pack
    expected = {'seq_len': pack.seq_len, 'packing': pack.packing, 'bos_id': pack.bos_id, 'eos_id': pack.eos_id}
    for state in states:
        for key, value in expected.items():
            if state.get(key) != value:
                raise ValueError(f'the position was saved by a loader with {key}={state.get(key)!r}, this one has '
                                 f'{key}={value!r}; restore it on a loader made with the same arguments')
        if len(state.get('sources', ())) != sources:
            raise ValueError(f"the position was saved by a loader of {len(state.get('sources', ()))} sources, this "
                             f'one reads {sources}')


def own_state(states: Sequence[dict[str, Any]], shard: int, shard_count: int) -> dict[str, Any] | None:
    """The position this rank continues exactly, when it was saved at the same world size (else None)."""
    same = [one for one in states if int(one['shard_count']) == shard_count and int(one['shard']) == shard]
    if not same:
        return None
    if len(states) == 1 or len(states) == shard_count:
        return same[0]
    return None


def intersect(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges both sorted lists of ranges cover."""
    out = []
    i = j = 0
    while i < len(first) and j < len(second):
        start, stop = max(first[i][0], second[j][0]), min(first[i][1], second[j][1])
        if start < stop:
            out.append((start, stop))
        if first[i][1] < second[j][1]:
            i += 1
        else:
            j += 1
    return out


def _rank_ranges(state: dict[str, Any], source: int) -> Ranges:
    """What one rank's position says is left of the documents of ``source`` it names."""
    part = state['sources'][source]
    ranges = ranges_of_entries(part.get('remaining'))
    packed = part.get('packer') or {}
    listed_ranges(packed.get('rows'), ranges, False)
    listed_ranges([row[1:] for row in packed.get('open', ())], ranges, False)
    if state.get('in_progress'):
        listed_ranges([row for row in state.get('rows', ()) if int(row[0]) == source], ranges, True)
    return ranges


def merged_ranges(states: Sequence[dict[str, Any]], source: int) -> Ranges:
    """What is left of the partly delivered documents of ``source``, from every rank's position."""
    merged: Ranges = {}
    for state in states:
        if not state.get('in_progress'):
            continue
        for doc, spans in _rank_ranges(state, source).items():
            merged[doc] = intersect(merged[doc], spans) if doc in merged else spans
    return merged


def merged_delivered(states: Sequence[dict[str, Any]], source: int) -> np.ndarray:
    """Runs of the documents of ``source`` a rank delivered whole while its reader still counted them as held."""
    return merged_runs(*[state['sources'][source].get('delivered', []) for state in states
                         if state.get('in_progress')])
