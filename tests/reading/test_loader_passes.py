"""What a new iter() of a loader means (petastorm.reading.BatchStream): every way a pass can stop, then iteration again.

A DataLoader user peeks with ``next(iter(loader))``, leaves a loop with ``break``, re-runs an interrupted notebook
cell; a trainer takes ``len(loader)`` batches (or fewer) and calls ``iter()`` for the next epoch. Each test checks
row ids: within a pass every row comes once, nothing held in the buffers is lost.
"""

import collections

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader

torch = pytest.importorskip('torch')
from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader  # noqa: E402

ROWS = 60


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    path = tmp_path_factory.mktemp('passes') / 'ids.parquet'
    ids = np.arange(ROWS, dtype=np.int64)
    pq.write_table(pa.table({'id': ids, 'x': ids.astype(np.float32)}), str(path), row_group_size=13)
    return f'file://{path}'


def _reader(url, **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    kwargs.setdefault('seed', 4)
    kwargs.setdefault('shuffle_rows', True)
    return make_batch_reader(url, **kwargs)


def _ids(batches):
    return [int(i) for batch in batches for i in batch['id']]


def _take(iterator, count):
    return [next(iterator) for _ in range(count)]


@pytest.mark.parametrize('loader_class', [DataLoader, BatchedDataLoader])
def test_every_way_of_stopping_a_pass_then_iterating_again_gives_a_whole_pass(url, loader_class):
    with loader_class(_reader(url), batch_size=8) as loader:
        assert len(loader) == 8
        first = _ids(loader)
        assert sorted(first) == list(range(ROWS))
        peeked = _ids([next(iter(loader))])                      # a look at one batch
        assert len(peeked) == 8
        again = _ids(loader)                                     # then a whole pass
        assert sorted(again) == list(range(ROWS))
        for _ in loader:                                         # a loop left with break
            break
        assert sorted(_ids(loader)) == list(range(ROWS))
        trainer = iter(loader)                                   # a trainer takes len() batches, never the end
        epoch = _ids(_take(trainer, len(loader)))
        assert sorted(epoch) == list(range(ROWS))
        assert sorted(_ids(loader)) == list(range(ROWS))         # and asks for the next epoch while it holds the old
        with pytest.raises(StopIteration):
            next(trainer)  # superseded after its pass was complete: it has nothing more to give


def test_passes_follow_the_readers_epochs_and_superseded_iterators_raise(url):
    def orders(loader, passes):
        return [_ids(loader) for _ in range(passes)]

    with DataLoader(_reader(url, num_epochs=1), batch_size=8) as loader:
        whole = orders(loader, 3)
    with DataLoader(_reader(url, num_epochs=1), batch_size=8) as loader:
        old = iter(loader)
        _take(old, 3)                                            # abandoned in the middle, still referenced
        cut = orders(loader, 2)
        with pytest.raises(RuntimeError, match='superseded by a newer iter'):
            next(old)
    assert cut == whole[1:], 'a new pass after an abandoned one reads the next epoch, in its order'
    assert len({tuple(order) for order in whole}) == 3, 'every pass has its own order'


def test_an_endless_reader_continues_where_the_last_iterator_stopped(url):
    def loader():
        return DataLoader(_reader(url, num_epochs=None), batch_size=7, shuffling_queue_capacity=20)

    with loader() as uninterrupted:
        reference = _ids(_take(iter(uninterrupted), 20))
    with loader() as epochs:
        stream = []
        for _ in range(4):                                       # a trainer's epochs of limit_train_batches=5
            stream += _ids(_take(iter(epochs), 5))
        with pytest.raises(TypeError):
            len(epochs)
    assert stream == reference, 'the same stream: rows in the buffers were kept for the next iterator'
    counts = collections.Counter(stream)
    assert sorted(counts) == list(range(ROWS))
    assert max(counts.values()) <= 3


class _Interrupting:
    """Raises KeyboardInterrupt (as Ctrl-C in a notebook would) when the loader asks the reader for a batch."""

    def __init__(self, reader, at):
        self.reader, self.at, self.calls = reader, at, 0
        self.column_batches = reader.column_batches

    def install(self):
        def column_batches(first_rows=None):
            inner = self.column_batches(first_rows)
            while True:
                self.calls += 1
                if self.calls == self.at:
                    raise KeyboardInterrupt
                try:
                    batch = next(inner)
                except StopIteration:
                    return
                yield batch
        self.reader.column_batches = column_batches


@pytest.mark.parametrize('num_epochs', [1, None])
def test_an_interrupted_pass_then_iterating_again(url, num_epochs):
    reader = _reader(url, num_epochs=num_epochs)
    # The loader asks for its first 5 rows first: the first row group comes in two reads (tests/reading/
    # test_first_rows.py), so the fourth read is the third row group.
    _Interrupting(reader, at=4).install()
    with DataLoader(reader, batch_size=5) as loader:
        batches = iter(loader)
        head = _ids(_take(batches, 5))
        with pytest.raises(KeyboardInterrupt):
            next(batches)
        assert len(head) == 25, 'two row groups of 13 rows gave 5 batches, the rest waits in the batcher'
        rest = _ids(_take(iter(loader), (ROWS - len(head)) // 5 if num_epochs is None else len(loader)))
    if num_epochs is None:
        assert sorted(head + rest) == list(range(ROWS)), 'the held row continues the endless pass'
    else:
        assert sorted(rest) == list(range(ROWS)), 'a new whole pass'


def test_a_state_saved_after_the_last_batch_is_between_passes(url):
    def loader():
        return DataLoader(_reader(url, num_epochs=1), batch_size=8)

    with loader() as reference:
        passes = [_ids(reference), _ids(reference)]
    with loader() as first:
        batches = iter(first)
        assert _ids(_take(batches, len(first))) == passes[0]
        state = first.state_dict()                               # a trainer's end-of-epoch checkpoint
    assert state['in_progress'] is False
    assert state['passes_done'] == 1
    with loader() as second:
        second.load_state_dict(state)
        assert _ids(second) == passes[1], 'the next pass, not an empty rest of the first one'


def test_a_restored_loader_keeps_the_length_of_a_pass_and_a_second_iter_keeps_the_position(url):
    with DataLoader(_reader(url), batch_size=8) as whole:
        reference = [b['id'].tolist() for b in whole]
    with DataLoader(_reader(url), batch_size=8) as first:
        head = [b['id'].tolist() for b in _take(iter(first), 3)]
        state = first.state_dict()
    with DataLoader(_reader(url), batch_size=8) as second:
        second.load_state_dict(state)
        assert len(second) == 8
        iter(second)                                             # a trainer calling iter() twice before reading
        tail = [b['id'].tolist() for b in second]
        second.load_state_dict(state)                            # also while a pass is being read: it is left
        assert [b['id'].tolist() for b in second] == tail
    assert head + tail == reference


def test_inmem_loader_serves_the_next_epochs_once_an_iteration_ended(url):
    loader = InMemBatchedDataLoader(_reader(url), batch_size=16, num_epochs=1, shuffle=True, seed=2, rows_capacity=99)
    first = iter(loader)
    epoch0 = _ids(_take(first, len(loader)))                     # a trainer never asks for the end
    epoch1 = _ids(loader)
    for _ in loader:
        break
    epoch3 = _ids(loader)
    assert sorted(epoch0) == sorted(epoch1) == sorted(epoch3) == list(range(ROWS))
    assert len({tuple(epoch0), tuple(epoch1), tuple(epoch3)}) == 3
