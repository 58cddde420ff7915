"""Saved positions of a token loader: their checks, and what ranks of another world size make of them.

A position is a dict of plain ints and lists (it fits JSON, ``torch.save`` and Grain's checkpoints)::

    {'format': 'petastorm.tokens', 'version': 1, 'seq_len', 'packing', 'bos_id', 'eos_id',
     'shard', 'shard_count', 'passes_done', 'in_progress', 'steps', 'total_steps', 'draws', 'picks', 'generation',
     'tokens': [per source], 'padding', 'rows': [[source, document, start, length, ...] per buffered row],
     'sources': [{'reader', 'remaining', 'packer'} per source]}

In a ``torch.distributed`` run a loader saves ``{'format', 'version', 'ranks': [every rank's position]}``.

Taking a position is cheap enough to do every step: a :class:`Position` holds its ``'format'`` at once and the
rest as a function of what the loader held then (arrays and lists that the loader replaces
rather than changes), made the first time they are read: by indexing, iteration, ``json``, ``pickle``,
``torch.save``, ``copy``, comparison. It is a ``dict``; pickled, it is a plain ``OrderedDict`` (which
``torch.load(weights_only=True)`` takes).

:func:`own_state` finds the one a rank continues exactly (same world size). Otherwise every rank continues from all
of them (:func:`merged_ranges`): the readers split the documents no rank delivered again, and what is left of
each partly delivered document is known by its ranges. A document is named by every rank that holds part of it
and, after an earlier restore on another world size, by ranks that only know it was partly delivered then; the
ranges of a rank that received it are within those, so the ranges left are what all of them name in common. A
document a rank lists as ``'delivered'`` (held by its reader's position, all of it handed out since) is dropped.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from petastorm.tokens._feed import listed_ranges, ranges_of_entries
from petastorm.tokens._held import merged_runs
from petastorm.tokens._options import TokenOptions
from petastorm.tokens._queue import Ranges

__all__ = ['FORMAT', 'VERSION', 'Position', 'check_states', 'intersect', 'merged_delivered', 'merged_ranges',
           'own_state', 'rank_states']

FORMAT = 'petastorm.tokens'
VERSION = 1


class Position(dict):  # type: ignore[type-arg]
    """A position whose lists are made when first read (see the module's documentation); made by :meth:`later`."""

    __slots__ = ('_rest',)
    _rest: Callable[[], dict[str, Any]] | None

    @classmethod
    def later(cls, numbers: dict[str, Any], rest: Callable[[], dict[str, Any]]) -> Position:
        """A position of ``numbers`` and, when first read, what ``rest`` makes.

        Args:
            numbers: the keys known at once (at least one: ``json`` writes an empty dict without reading it).
            rest: makes the other keys (called once).
        """
        position = cls(numbers)  # dict's own __init__: a Python one would cost as much as the rest of the call
        position._rest = rest
        return position

    def _made(self) -> Position:
        rest = self._rest
        if rest is not None:
            self._rest = None
            dict.update(self, rest())
        return self

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Position):
            other._made()
        return dict.__eq__(self._made(), other)

    def __ne__(self, other: object) -> bool:
        return not self == other

    __hash__ = None  # type: ignore[assignment]

    def __reduce_ex__(self, protocol: Any) -> Any:
        return collections.OrderedDict, (), None, None, iter(self.items())

    def __copy__(self) -> dict[str, Any]:
        return dict(self.items())

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        import copy

        return copy.deepcopy(dict(self.items()), memo)


def _made_first(name: str) -> Any:
    method = getattr(dict, name)

    def call(self: Position, *args: Any, **kwargs: Any) -> Any:
        return method(self._made(), *args, **kwargs)

    call.__name__ = name
    call.__doc__ = method.__doc__
    return call


# Every other way to read or change a dict makes the lists first (C code that reads a dict's memory directly
# calls these for a subclass: json's encoder its items(), dict() and ** its keys() and __getitem__).
for _name in ('__getitem__', '__contains__', '__iter__', '__reversed__', '__len__', '__repr__', '__or__', '__ror__',
              '__ior__', '__setitem__', '__delitem__', 'get', 'keys', 'values', 'items', 'copy', 'pop', 'popitem',
              'setdefault', 'update', 'clear'):
    setattr(Position, _name, _made_first(_name))


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
