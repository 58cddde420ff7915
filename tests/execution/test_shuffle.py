"""petastorm.shuffle without any framework: the buffers' laws, one order per seed with and without the kernel."""

import collections
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from petastorm.shuffle import (
    NO_COMPILED_SHUFFLE_ENV,
    Batcher,
    ColumnStore,
    NumpyOps,
    PackedColumns,
    ShufflingBuffer,
    _draw,
    compiled_shuffle_in_use,
)
from petastorm.shuffle._compiled import built_kernel

KERNEL_BUILT = built_kernel() is not None
LAYOUTS = ['columns', 'numpy records', 'compiled records']


@pytest.fixture
def kernel_switch(monkeypatch):
    """Sets up one of LAYOUTS: the environment switch, and whether buffers pack their rows."""
    def use(layout):
        if layout == 'compiled records' and not KERNEL_BUILT:
            pytest.skip('the compiled kernel was not built')
        if layout == 'numpy records':
            monkeypatch.setenv(NO_COMPILED_SHUFFLE_ENV, '1')
        else:
            monkeypatch.delenv(NO_COMPILED_SHUFFLE_ENV, raising=False)
        return layout != 'columns'
    return use


def _chunk(start, size):
    """Rows ``start...`` with every kind of column the buffers keep: each value derived from the row's id."""
    ids = np.arange(start, start + size)
    return {'i': ids, 'f': ids.astype(np.float32) / 2, 'b': (ids % 256).astype(np.uint8),
            'h': ids.astype(np.float16), 's': (-ids).astype(np.int16), 'c': ids * (1 + 2j),
            'm': np.stack([ids, -ids], axis=1)}


def _check_rows(piece):
    """Every column of every row handed out belongs to the same original row."""
    ids = piece['i']
    assert (piece['m'][:, 0] == ids).all()
    assert (piece['m'][:, 1] == -ids).all()
    assert (piece['f'] == ids / 2).all()
    assert (piece['b'] == ids % 256).all()
    assert (piece['h'] == ids.astype(np.float16)).all()
    assert (piece['s'] == -ids).all()
    assert (piece['c'] == ids * (1 + 2j)).all()
    assert all(column.flags.c_contiguous for column in piece.values())


def _shuffle(seed, chunks, capacity, batch_size, packed, check=None):
    """Every id handed out by a buffer fed ``chunks`` (sizes) then drained, in order."""
    buffer = ShufflingBuffer(capacity, np.random.default_rng(seed), NumpyOps(), batch_size, packed=packed)
    out, start = [], 0
    for size in chunks:
        drawn = buffer.add(_chunk(start, size))
        start += size
        if check is not None:
            check(buffer, drawn, start)
        out.extend(piece['i'] for piece in drawn)
    rest = buffer.drain()
    assert len(buffer) == 0
    assert all(len(piece['i']) % batch_size == 0 for piece in rest[:-1])
    out.extend(piece['i'] for piece in rest)
    return np.concatenate(out).tolist() if out else []


@pytest.mark.parametrize('piece_rows', [1, 8, 4096])
@pytest.mark.parametrize('batch_size', [1, 4])
@pytest.mark.parametrize('layout', LAYOUTS)
def test_buffer_laws(layout, batch_size, piece_rows, kernel_switch, monkeypatch):
    packed = kernel_switch(layout)
    monkeypatch.setattr(_draw, '_PIECE_ROWS', piece_rows)  # tables of one batch, of several, of all drawn

    def check(buffer, drawn, added):
        assert isinstance(buffer._store, PackedColumns) == packed
        assert getattr(buffer._store, 'compiled', False) == (layout == 'compiled records')
        # At least capacity - 1 rows stay, and fewer than a batch more: draws are whole batches.
        assert min(added, capacity - 1) <= len(buffer) <= max(capacity - 1, 0) + batch_size - 1
        for piece in drawn:
            assert 0 < len(piece['i']) <= max(piece_rows, batch_size)
            assert len(piece['i']) % batch_size == 0
            _check_rows(piece)

    for capacity, chunks in [(1, [5, 5]), (10, [3, 30, 1, 7]), (100, [20, 20]), (6, [2, 9, 1, 1, 13])]:
        ids = _shuffle(0, chunks, capacity, batch_size, packed, check)
        assert sorted(ids) == list(range(sum(chunks)))  # every row exactly once
        if sum(chunks) > 20:
            assert ids != sorted(ids)


def test_rows_come_out_in_the_same_order_with_and_without_the_kernel(kernel_switch):
    """One order per seed on every install: per-column storage, numpy records and compiled records agree."""
    for seed, capacity, batch_size, chunks in [(0, 100, 4, [30, 70, 5, 200, 1, 64]), (1, 7, 1, [3, 3, 3, 40]),
                                               (2, 1000, 16, [300, 600, 2000, 5]), (3, 50, 50, [49, 1, 51])]:
        orders = {}
        for layout in LAYOUTS:
            if layout == 'compiled records' and not KERNEL_BUILT:
                continue
            orders[layout] = _shuffle(seed, chunks, capacity, batch_size, kernel_switch(layout))
        assert len(set(map(tuple, orders.values()))) == 1, orders


@pytest.mark.parametrize('layout', LAYOUTS)
def test_same_seed_same_order_other_seeds_differ(layout, kernel_switch):
    packed = kernel_switch(layout)
    chunks = [40, 40, 40]
    first = _shuffle(11, chunks, 30, 2, packed)
    assert first == _shuffle(11, chunks, 30, 2, packed)
    others = [_shuffle(seed, chunks, 30, 2, packed) for seed in (12, 13, 14)]
    assert all(other != first for other in others)
    assert all(sorted(other) == sorted(first) for other in others)


def _swap_removes(size, words):
    """The draw spelled out one row at a time: what each draw takes, and the positions kept afterwards."""
    held = list(range(size))
    taken = []
    for t, word in enumerate(words.tolist()):
        pick = (word * (size - t)) >> 64
        taken.append(held[pick])
        held[pick] = held[-1]
        held.pop()
    return taken, held


@settings(max_examples=300, deadline=None)
@given(size=st.integers(1, 300), fraction=st.floats(0, 1), seed=st.integers(0, 2 ** 32))
def test_replay_matches_drawing_one_row_at_a_time(size, fraction, seed):
    count = max(1, round(size * fraction))
    words = _draw.Draw.of(np.random.default_rng(seed), size, count, 7).words()
    taken, kept = _swap_removes(size, words)
    moves = _draw.replay(size, words)
    assert moves.taken.tolist() == taken
    arranged = np.arange(size - count)
    arranged[moves.holes] = moves.fillers
    assert arranged.tolist() == kept
    assert (np.diff(moves.holes) > 0).all()
    assert (moves.fillers >= size - count).all()


def test_picks_scale_the_words_exactly():
    words = np.array([0, 1, 2 ** 32 - 1, 2 ** 32, 2 ** 63, 2 ** 64 - 1, 0x9E3779B97F4A7C15, 12345678901234567890],
                     dtype=np.uint64)
    for size in (8, 1000, 2 ** 31 - 1):
        got = _draw.picks(size, words).tolist()
        assert got == [(int(w) * (size - t)) >> 64 for t, w in enumerate(words)]
        assert all(0 <= pick < size - t for t, pick in enumerate(got))


def test_draw_orders_are_uniform():
    """All 24 orders of 4 rows come out about equally often (4800 seeds: 200 each expected)."""
    counts = collections.Counter(tuple(_draw.replay(4, _draw.Draw.of(np.random.default_rng(seed), 4, 4, 4).words())
                                       .taken.tolist()) for seed in range(4800))
    assert len(counts) == 24
    # Binomial(4800, 1/24): standard deviation 13.7, so 200 +- 70 is more than 5 of them.
    assert all(130 <= c <= 270 for c in counts.values()), counts


def test_a_draw_refuses_what_no_buffer_draws():
    with pytest.raises(ValueError, match='count=0 of size=3'):
        _draw.Draw(3, 0, 1, 1)
    with pytest.raises(ValueError, match='count=4 of size=3'):
        _draw.Draw(3, 4, 1, 1)
    with pytest.raises(ValueError, match='at most 2147483647 rows'):
        _draw.Draw(2 ** 31, 1, 1, 1)


def _splitmix64(key, count):
    """SplitMix64 spelled out with Python integers: its outputs 1 to ``count`` from state ``key``."""
    mask, out, state = 2 ** 64 - 1, [], key
    for _ in range(count):
        state = (state + 0x9E3779B97F4A7C15) & mask
        z = ((state ^ (state >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        out.append(z ^ (z >> 31))
    return out


def test_words_are_splitmix64_from_a_key_of_the_generator():
    rng = np.random.default_rng(4)
    draw = _draw.Draw.of(rng, 100, 90, 16)
    assert draw.key == int(np.random.default_rng(4).bit_generator.random_raw())  # one word of the generator
    assert draw.words().tolist() == _splitmix64(draw.key, 90)
    assert _draw.Draw(10, 3, 0, 1).words().tolist() == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F]
    assert list(draw.pieces()) == [(100, 0, 16), (84, 16, 16), (68, 32, 16), (52, 48, 16), (36, 64, 16), (20, 80, 10)]


def test_environment_switch_is_read_when_a_buffer_is_made(monkeypatch):
    monkeypatch.setenv(NO_COMPILED_SHUFFLE_ENV, '1')
    assert not compiled_shuffle_in_use()
    switched_off = ShufflingBuffer(4, np.random.default_rng(0), NumpyOps(), packed=True)
    monkeypatch.setenv(NO_COMPILED_SHUFFLE_ENV, '0')
    assert compiled_shuffle_in_use() == KERNEL_BUILT
    made_after = ShufflingBuffer(4, np.random.default_rng(0), NumpyOps(), packed=True)
    monkeypatch.delenv(NO_COMPILED_SHUFFLE_ENV)
    assert compiled_shuffle_in_use() == KERNEL_BUILT
    for buffer, compiled in ((switched_off, False), (made_after, KERNEL_BUILT)):
        buffer.add(_chunk(0, 10))
        assert buffer._store.compiled == compiled
    assert PackedColumns(_chunk(0, 1), 1).compiled == KERNEL_BUILT
    monkeypatch.setenv(NO_COMPILED_SHUFFLE_ENV, 'yes')
    with pytest.raises(ValueError, match=f"{NO_COMPILED_SHUFFLE_ENV}='yes': expected 1"):
        compiled_shuffle_in_use()
    with pytest.raises(ValueError, match=NO_COMPILED_SHUFFLE_ENV):
        ShufflingBuffer(4, np.random.default_rng(0), NumpyOps(), packed=True)


def test_asking_for_the_kernel_where_it_is_not_built_names_it(monkeypatch):
    from petastorm.shuffle import _records

    monkeypatch.setattr(_records, 'built_kernel', lambda: None)  # as installed without a C compiler
    with pytest.raises(ImportError, match=r'petastorm\.shuffle\._kernel'):
        PackedColumns(_chunk(0, 1), 1, compiled=True)
    assert not PackedColumns(_chunk(0, 1), 1, compiled=False).compiled


def test_importing_the_package_loads_no_framework():
    code = ('import sys, petastorm.shuffle\n'
            'print(",".join(sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "tensorflow", "pyspark"))))')
    loaded = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True, check=True).stdout.strip()
    assert loaded == ''


def _cut(batcher, table):
    """Queue ``table`` in ``batcher`` and return the full batches it can now make."""
    batcher.put(table)
    return list(batcher.batches())


def test_batcher_is_first_in_first_out_whatever_the_chunk_sizes():
    batcher = Batcher(4, NumpyOps())
    got = [b['x'].tolist() for chunk in ([0, 1, 2], [3, 4, 5, 6, 7, 8], [9]) for b in _cut(
        batcher, {'x': np.array(chunk)})]
    assert [part.tolist() for part in batcher.held('x')] == [[8], [9]]
    got += [b['x'].tolist() for b in batcher.flush()]
    assert got == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert list(batcher.flush()) == []
    whole = {'x': np.arange(4)}
    assert _cut(batcher, whole)[0] is whole  # a chunk of exactly one batch goes out as it came


def test_numpy_ops_keep_columns_whose_layout_changes_as_row_values():
    buffer = ShufflingBuffer(3, np.random.default_rng(0), NumpyOps())
    drawn = buffer.add({'v': np.array([[1, 2], [3, 4]]), 's': np.array(['a', 'b'])})
    drawn += buffer.add({'v': np.array([[5, 6, 7]]), 's': np.array(['long'])})  # another row shape, a wider string
    assert isinstance(buffer._store, ColumnStore)
    drawn += buffer.drain()
    rows = {str(s): v.tolist() for piece in drawn for s, v in zip(piece['s'], piece['v'], strict=True)}
    assert rows == {'a': [1, 2], 'b': [3, 4], 'long': [5, 6, 7]}


def test_packed_columns_keep_values_and_own_their_output():
    rng = np.random.default_rng(1)
    table = {'a': np.arange(10, dtype=np.int64), 'b': rng.random(10).astype(np.float32),
             'c': np.arange(10, dtype=np.int32) * 3, 'img': rng.integers(0, 255, (10, 2, 2), dtype=np.uint8)}
    packed = PackedColumns(table, 10)
    packed.write(0, table)
    index = np.array([7, 0, 3])
    taken = packed.take(index)
    for name, column in table.items():
        np.testing.assert_array_equal(taken[name], column[index])
        assert taken[name].dtype == column.dtype
        assert taken[name].flags.c_contiguous
    sliced = packed.slice(2, 5)
    sliced['a'][:] = -1
    np.testing.assert_array_equal(packed.slice(2, 5)['a'], [2, 3, 4])
    packed.move(np.array([9, 8]), np.array([0, 1]))
    np.testing.assert_array_equal(packed.slice(0, 2)['c'], [27, 24])
    np.testing.assert_array_equal(packed.slice(0, 2)['img'], table['img'][[9, 8]])
    with pytest.raises(TypeError, match='columns changed between row groups'):
        packed.grown({**table, 'c': table['c'].astype(np.int64)}, 20, 10)


def test_packed_columns_align_mixed_widths():
    n = 9
    table = {'u8': np.arange(n, dtype=np.uint8), 'i16': -np.arange(n, dtype=np.int16),
             'c64': (np.arange(n) * (1 + 2j)).astype(np.complex64), 'f64': np.linspace(0, 1, n),
             'i32': np.arange(n, dtype=np.int32) * 7, 'vec': np.arange(n * 3, dtype=np.float32).reshape(n, 3)}
    packed = PackedColumns(table, 0).grown(table, n, 0)
    packed.write(0, table)
    assert packed.row_nbytes == 1 + 2 + 8 + 8 + 4 + 12
    taken = packed.take(np.array([8, 2, 5]))
    for name, column in table.items():
        np.testing.assert_array_equal(taken[name], column[[8, 2, 5]])
        assert taken[name].dtype == column.dtype
        assert taken[name].flags.c_contiguous
    grown = packed.grown(table, 2 * n, n)
    grown.write(n, table)
    np.testing.assert_array_equal(grown.slice(n - 1, n + 1)['f64'], table['f64'][[n - 1, 0]])
