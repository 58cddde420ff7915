"""petastorm.shuffle._kernel, the compiled loops of the shuffling buffer, and PackedColumns' use of them."""

import collections
import shutil
import sysconfig

import numpy as np
import pytest

from petastorm.shuffle import PackedColumns, _draw, _records, compiled_shuffle_in_use


def _has_compiler():
    return shutil.which((sysconfig.get_config_var('CC') or 'cc').split()[0]) is not None


@pytest.fixture
def kernel(monkeypatch):
    monkeypatch.delenv('PETASTORM_NO_COMPILED_SHUFFLE', raising=False)
    return pytest.importorskip('petastorm.shuffle._kernel')


@pytest.mark.skipif(not _has_compiler(), reason='no C compiler: the package was installed without its compiled loops')
def test_kernel_is_built_where_a_compiler_is(monkeypatch):
    """An install on a machine with a C compiler (as `make test` does) must have built the compiled loops."""
    from petastorm.shuffle import _kernel as built

    monkeypatch.delenv('PETASTORM_NO_COMPILED_SHUFFLE', raising=False)
    assert callable(built.pack)
    assert callable(built.draw)
    assert callable(built.gather)
    assert compiled_shuffle_in_use()
    assert _records.kernel_in_use() is built


def _table(n):
    ids = np.arange(n)
    return {'i': ids.astype(np.int64), 'f': (ids / 2).astype(np.float32), 'b': (ids % 256).astype(np.uint8),
            'c': (ids * (1 + 2j)).astype(np.complex64), 'm': np.stack([ids, -ids], axis=1).astype(np.int16)}


def _store(n, compiled=True):
    table = _table(n)
    store = PackedColumns(table, 0, compiled=compiled).grown(table, n, 0)
    store.write(0, table)
    assert store.compiled is compiled
    return store


def _draw_all(store, size, count, seed, piece_rows=64):
    """Draw ``count`` of ``size`` rows with words of a generator seeded by ``seed``, as one table."""
    pieces = store.draw(_draw.Draw.of(np.random.default_rng(seed), size, count, piece_rows))
    assert [len(piece['i']) for piece in pieces[:-1]] == [piece_rows] * (len(pieces) - 1)
    return {name: np.concatenate([piece[name] for piece in pieces]) for name in pieces[0]}


def _check_rows(drawn):
    """Every field of a drawn row belongs to the same original row."""
    ids = drawn['i']
    assert (drawn['f'] == (ids / 2).astype(np.float32)).all()
    assert (drawn['b'] == ids % 256).all()
    assert (drawn['c'] == (ids * (1 + 2j)).astype(np.complex64)).all()
    assert (drawn['m'][:, 0] == ids).all()
    assert (drawn['m'][:, 1] == -ids).all()


def test_draw_is_a_seeded_sample_without_replacement_keeping_the_rest_in_front(kernel):
    n = 1000
    first, second = _store(n), _store(n)
    drawn = _draw_all(first, n, 300, seed=11)
    assert list(drawn) == ['i', 'f', 'b', 'c', 'm']
    _check_rows(drawn)
    ids = drawn['i'].tolist()
    assert len(set(ids)) == 300
    kept = first.column('i', n - 300).tolist()
    assert sorted(ids + kept) == list(range(n))  # drawn and kept split the rows
    np.testing.assert_array_equal(first.column('m', n - 300)[:, 0], kept)  # array rows moved with their scalars
    np.testing.assert_array_equal(_draw_all(second, n, 300, seed=11)['i'], drawn['i'])
    assert _draw_all(_store(n), n, 300, seed=12)['i'].tolist() != ids
    rest = _draw_all(first, n - 300, n - 300, seed=5)  # everything left: a permutation of it
    assert sorted(rest['i'].tolist()) == sorted(kept)
    _check_rows(rest)


@pytest.mark.parametrize(('size', 'count', 'piece_rows'), [(1000, 300, 64), (1000, 1000, 256), (5000, 17, 4),
                                                           (1, 1, 1), (600, 599, 1000)])
def test_kernel_and_numpy_draw_the_same_rows_and_keep_the_same_arrangement(kernel, size, count, piece_rows):
    compiled, replayed = _store(size), _store(size, compiled=False)
    held = size
    for seed in range(3):  # later draws take from what the earlier ones kept, where they kept it
        if not held:
            break
        take = max(1, min(count, held) // (seed + 1))
        a = _draw_all(compiled, held, take, seed, piece_rows)
        b = _draw_all(replayed, held, take, seed, piece_rows)
        held -= take
        for name in a:
            np.testing.assert_array_equal(a[name], b[name])
            np.testing.assert_array_equal(compiled.column(name, held), replayed.column(name, held))


def test_draw_orders_are_uniform(kernel):
    """All 24 orders of 4 rows come out about equally often (6000 seeded draws: 250 each expected)."""
    counts = collections.Counter(tuple(_draw_all(_store(4), 4, 4, seed)['i'].tolist()) for seed in range(6000))
    assert len(counts) == 24
    # Binomial(6000, 1/24): standard deviation 15.3, so 250 +- 80 is more than 5 of them.
    assert all(170 <= c <= 330 for c in counts.values()), counts


def test_first_pick_position_is_uniform(kernel):
    """The position picked first, over 20000 seeds, is uniform over the 10 held rows (about 2000 each)."""
    counts = np.zeros(10, dtype=np.int64)
    for seed in range(20000):
        counts[_draw_all(_store(10), 10, 1, seed)['i'][0]] += 1
    # Binomial(20000, 0.1): standard deviation 42, so 2000 +- 220 is more than 5 of them.
    assert (np.abs(counts - 2000) < 220).all(), counts


@pytest.mark.parametrize('compiled', [True, False])
def test_pack_and_numpy_pack_write_the_same_fields(compiled):
    if compiled:
        pytest.importorskip('petastorm.shuffle._kernel')
    n = 9
    table = {'u8': np.arange(n, dtype=np.uint8), 'i16': -np.arange(n, dtype=np.int16),
             'c64': (np.arange(n) * (1 + 2j)).astype(np.complex64), 'f64': np.linspace(0, 1, n),
             'i32': np.arange(n, dtype=np.int32)[::-1].copy(), 'vec': np.arange(n * 3, dtype=np.float32).reshape(n, 3)}
    store = PackedColumns(table, 0, compiled=compiled).grown(table, 3 * n, 0)
    assert store.compiled is compiled
    store.write(0, table)
    store.write(n, {name: column[::-1] for name, column in table.items()})  # not contiguous: copied first
    for name, column in table.items():
        np.testing.assert_array_equal(store.column(name, 2 * n), np.concatenate([column, column[::-1]]))


def test_records_start_at_a_cache_line():
    for rows, width in ((1, 8), (3, 24), (1000, 64)):
        records = _records._cache_aligned_records(rows, width)
        assert len(records) == rows
        assert records.dtype.itemsize == width
        assert records.ctypes.data % 64 == 0
    assert len(_records._cache_aligned_records(0, 8)) == 0


def test_kernel_refuses_bad_buffers_before_moving_bytes(kernel):
    store = np.zeros(10 * 8, dtype=np.uint8)
    column = np.arange(10, dtype=np.int64)
    with pytest.raises(ValueError, match='expected 80'):
        kernel.pack(store, 8, 0, 10, [(column[:9], 0, 8)])
    with pytest.raises(ValueError, match='do not fit a 8-byte row'):
        kernel.pack(store, 8, 0, 10, [(column, 4, 8)])
    with pytest.raises(ValueError, match='at least 88'):
        kernel.pack(store, 8, 1, 10, [(column, 0, 8)])
    with pytest.raises(ValueError, match='not C-contiguous'):
        kernel.pack(store, 8, 0, 5, [(column[::2], 0, 8)])
    with pytest.raises(TypeError, match='must be a tuple'):
        kernel.pack(store, 8, 0, 10, [[column, 0, 8]])
    out = np.empty(3, dtype=np.int64)
    with pytest.raises(ValueError, match='count=11 size=10'):
        kernel.draw(10, 11, 0, 0, [(store, 8, [(out, 0, 8)])])
    with pytest.raises(ValueError, match='expected 32'):
        kernel.draw(10, 4, 0, 0, [(store, 8, [(out, 0, 8)])])
    with pytest.raises(ValueError, match='at least 88'):
        kernel.draw(11, 3, 0, 0, [(store, 8, [(out, 0, 8)])])
    with pytest.raises(TypeError, match='must be a tuple'):
        kernel.draw(10, 3, 0, 0, [[store, 8, [(out, 0, 8)]]])
    out.flags.writeable = False
    with pytest.raises((BufferError, ValueError)):
        kernel.draw(10, 3, 0, 0, [(store, 8, [(out, 0, 8)])])
    assert not store.any()  # nothing was written by any refused call
