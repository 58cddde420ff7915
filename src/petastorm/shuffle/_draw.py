"""One draw of a shuffling buffer: its random words, and their numpy replay where the compiled kernel is not used.

A draw takes ``count`` of the ``size`` rows held, one at a time, uniformly at random without replacement: draw ``t``
takes the row at position ``floor(words[t] * (size - t) / 2**64)`` among the ``size - t`` rows still held, and the
last row held fills its place (a *swap-remove*), so the rows kept are the first ``size - count`` positions
afterwards. ``words`` are the outputs of SplitMix64 (Steele, Lea and Flood, 2014) started at a ``key``, one 64-bit
word of the buffer's ``numpy.random.Generator`` per draw: a draw is a pure function of the generator's state
(:class:`Draw`). SplitMix64 is a counter passed through a mixing function, so any word can be computed on its own:
by the kernel inline, by numpy for a whole draw at once. The multiply-shift scaling is uniform to within
``range / 2**64`` per position (below ``1e-9`` for any buffer that fits in memory); numpy and the kernel do the same
64-bit arithmetic, exactly.

Two ways carry a draw out, with the same result:

* the compiled kernel (``PackedColumns`` with the kernel in use) does the swap-removes one row at a time, the
  fastest way: each refilled place is still in the cache, and later draws read an ever smaller part of memory;
* :func:`replay` works out with whole-array numpy operations where the sequence of swap-removes takes each row
  from and where it leaves the rows kept; :func:`draw_by_gathers` then gathers and moves rows with numpy.

Why not the other way round, the kernel taking positions drawn by numpy (``rng.choice``, which numpy could gather
directly): drawing them, and working out which kept rows fill the holes, costs numpy about as much per row as the
whole compiled draw; the compiled draw became about twice as slow (31 against 16 ns a row, drawing 159,744 of
260,000 rows of 56 bytes). Words made by numpy (``random_raw``) and handed to the kernel cost it about 1 ns a row
more than words it computes itself. Replaying the kernel's draw costs the numpy path about 25 ns a row instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from petastorm.shuffle._tables import Table

# Rows of each drawn table (whole batches, at least one): a few numpy calls cover many batches, and the arrays
# stay small enough for the allocator to reuse their memory instead of asking the operating system for it.
_PIECE_ROWS = 4096
# Rows moved at a time when filling holes with numpy: keeps the temporary copies below the allocator's large-block
# size.
_MOVE_ROWS = 8192
# Rows a buffer may hold: the replay packs a pick and a draw number into one int64 sort key.
MAX_ROWS = 2 ** 31 - 1


# SplitMix64's state increment and the multipliers of its output mix (the kernel's draw_word uses the same).
_GAMMA = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class Draw:
    """One draw: ``count`` of ``size`` held rows, handed out as tables of ``piece_rows`` rows (the last may be shorter).

    Attributes:
        size: rows held before the draw.
        count: rows drawn.
        key: where the draw's SplitMix64 words start (a 64-bit word of the buffer's generator).
        piece_rows: rows per handed-out table.

    Raises:
        ValueError: ``count`` is not in ``(0, size]``, or ``size`` is beyond what a buffer can hold (``2**31 - 1``
            rows).
    """

    size: int
    count: int
    key: int
    piece_rows: int

    def __post_init__(self) -> None:
        if not 0 < self.count <= self.size:
            raise ValueError(f'a draw takes 0 < count <= size rows, got count={self.count} of size={self.size}')
        if self.size > MAX_ROWS:
            raise ValueError(f'a shuffling buffer holds at most {MAX_ROWS} rows, got {self.size}; use a smaller '
                             f'shuffling_queue_capacity')

    @classmethod
    def of(cls, rng: np.random.Generator, size: int, count: int, piece_rows: int) -> Draw:
        """A draw of ``count`` of ``size`` rows keyed by the next word of ``rng`` (which it advances by one word)."""
        return cls(size, count, int(rng.bit_generator.random_raw()), piece_rows)

    @property
    def keep(self) -> int:
        """Rows held after the draw: they end up at positions ``[0, keep)``."""
        return self.size - self.count

    def words(self) -> np.ndarray:
        """The draw's ``count`` random words (uint64): SplitMix64's outputs 1 to ``count`` from ``key``."""
        z = np.arange(1, self.count + 1, dtype=np.uint64)
        z *= _GAMMA
        z += np.uint64(self.key)
        z ^= z >> np.uint64(30)
        z *= _MIX1
        z ^= z >> np.uint64(27)
        z *= _MIX2
        z ^= z >> np.uint64(31)
        return z

    def pieces(self) -> Iterator[tuple[int, int, int]]:
        """``(rows held before the piece, rows of the draw handed out before it, its rows)`` per handed-out table."""
        for start in range(0, self.count, self.piece_rows):
            yield self.size - start, start, min(self.piece_rows, self.count - start)


def piece_rows_for(batch_size: int) -> int:
    """Rows of each table a draw hands out: whole batches, about ``_PIECE_ROWS`` rows (at least one batch)."""
    return batch_size * max(1, _PIECE_ROWS // batch_size)


def picks(size: int, words: np.ndarray) -> np.ndarray:
    """The position draw ``t`` takes among the ``size - t`` rows then held: ``floor(words[t] * (size - t) / 2**64)``.

    Computed in 64-bit pieces (high and low halves of each word), exactly as the kernel does.
    """
    held = np.arange(size, size - len(words), -1, dtype=np.uint64)
    low = words & np.uint64(0xFFFFFFFF)
    low *= held
    low >>= np.uint64(32)
    high = words >> np.uint64(32)
    high *= held
    high += low
    high >>= np.uint64(32)
    return high.view(np.int64)  # below 2**32: the same value


@dataclass(frozen=True)
class Replay:
    """What a sequence of swap-removes amounts to, in positions of the storage before the draw.

    Attributes:
        taken: the position each drawn row had, in the order drawn.
        holes: positions below ``keep`` left by drawn rows (each once, ascending).
        fillers: the positions (``keep`` or above) of the kept rows that end up in ``holes``, one each.
    """

    taken: np.ndarray
    holes: np.ndarray
    fillers: np.ndarray


def replay(size: int, words: np.ndarray) -> Replay:
    """Work out, with whole-array operations, where the draw of ``words`` from ``size`` rows takes and leaves rows.

    Let ``j[t]`` be draw ``t``'s pick and ``top[t] = size - 1 - t`` the last place held at draw ``t``. Draw ``t``
    hands out what is at ``j[t]`` and moves what is at ``top[t]`` there. A place holds its original row until a
    draw picks it; from then on it holds what the last draw that picked it moved in. So, with ``moved[t]`` the
    original position of the row draw ``t`` moves:

    * ``moved[t] = moved[u]`` for the last draw ``u`` that picked ``top[t]``, else ``top[t]`` itself (no later draw
      can pick ``top[t]``: later draws pick below it; when ``u`` is ``t`` itself, ``moved[t]`` is never used);
    * ``taken[t] = moved[u]`` for the last draw ``u`` before ``t`` that picked ``j[t]``, else ``j[t]``;
    * a kept place (below ``size - count``) that was picked ends with ``moved[u]`` of its last pick ``u``.

    The ``moved`` links form chains going back in time; they are short (most draws have none, a drain of 100,000
    rows has chains of about 16 steps at most) and are followed by pointer doubling.
    """
    count = len(words)
    keep = size - count
    j = picks(size, words)
    # Sort draws by (pick, draw number) in one key: groups of draws that picked the same place, in draw order.
    bits = count.bit_length()
    keys = j << bits
    keys |= np.arange(count, dtype=np.int64)
    keys.sort()
    order = keys & ((1 << bits) - 1)  # draw numbers, grouped by pick
    keys >>= bits  # the picks, sorted
    repeated = keys[1:] == keys[:-1]  # sorted k + 1 picked the same place as sorted k, later
    last_of_group = np.empty(count, dtype=bool)
    last_of_group[-1] = True
    np.logical_not(repeated, out=last_of_group[:-1])
    # Places at keep or above are the tops: top[t] - keep = count - 1 - t. Each links draw t to the last draw that
    # picked its top.
    first_top = int(np.searchsorted(keys, keep))
    top_lasts = np.flatnonzero(last_of_group[first_top:])
    top_lasts += first_top
    linked = (count - 1 + keep) - keys[top_lasts]
    sources = order[top_lasts]
    # root[t]: the first draw of t's chain (t itself when unlinked), found by pointer doubling on the linked draws
    # only (about a third of them; chains are short).
    root = np.arange(count, dtype=np.int64)
    root[linked] = sources
    active = linked[linked != sources]
    while active.size:
        step = root[active]
        further = root[step]
        root[active] = further
        active = active[further != step]
    # moved[t] = top[root[t]] = size - 1 - root[t], computed only where it is used.
    taken = j  # a draw that picks a place no earlier draw picked takes the place's own row
    repeats = np.flatnonzero(repeated)
    taken[order[repeats + 1]] = (size - 1) - root[order[repeats]]
    low_lasts = np.flatnonzero(last_of_group[:first_top])
    return Replay(taken, keys[low_lasts], (size - 1) - root[order[low_lasts]])


class GatherStore(Protocol):
    """The two storage operations a draw by gathers needs."""

    def take(self, index: np.ndarray) -> Table:
        """New columns of the rows at ``index``, in that order."""
        ...

    def move(self, source: np.ndarray, target: np.ndarray) -> None:
        """Row ``target[i]`` becomes row ``source[i]`` (disjoint index sets)."""
        ...


def draw_by_gathers(store: GatherStore, draw: Draw) -> list[Table]:
    """Carry out ``draw`` on ``store`` with numpy: the drawn rows gathered as tables, then the holes refilled."""
    moves = replay(draw.size, draw.words())
    drawn = [store.take(moves.taken[start:start + draw.piece_rows])
             for start in range(0, draw.count, draw.piece_rows)]
    for start in range(0, len(moves.holes), _MOVE_ROWS):  # in blocks: small temporary arrays
        store.move(moves.fillers[start:start + _MOVE_ROWS], moves.holes[start:start + _MOVE_ROWS])
    return drawn
