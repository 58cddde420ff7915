"""petastorm.pytorch as torch users try it first: drop_last, torch's own arguments, bool tensors, len() of splits."""

import math
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip('torch')

from petastorm import make_batch_reader, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import ScalarCodec  # noqa: E402
from petastorm.ngram import NGram  # noqa: E402
from petastorm.predicates import in_lambda, in_pseudorandom_split  # noqa: E402
from petastorm.pytorch import BatchedDataLoader, DataLoader, InMemBatchedDataLoader, LoaderArgumentError  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = 103  # not a multiple of the batch sizes below
LOADERS = [DataLoader, BatchedDataLoader, InMemBatchedDataLoader]
Schema = Unischema('Conventions', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('flag', np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField('mask', np.bool_, (3,), None, False),
])


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    """Our dataset: an id, a bool and a bool array; 103 rows in row groups of about 10."""
    target = 'file://' + str(tmp_path_factory.mktemp('conventions') / 'ds')
    rows = ({'id': i, 'flag': i % 2 == 0, 'mask': np.array([i % 2 == 0, True, False])} for i in range(ROWS))
    write_dataset(target, Schema, rows, row_group_size_mb=0.0002)
    return target


@pytest.fixture(scope='module')
def plain_url(tmp_path_factory):
    """Plain Parquet, 103 rows in row groups of 10 (ids in order, so the footers' statistics cut cleanly)."""
    root = tmp_path_factory.mktemp('conventions_plain')
    pq.write_table(pa.table({'id': np.arange(ROWS), 'x': np.arange(ROWS) / 2.0}), str(root / 'data.parquet'),
                   row_group_size=10)
    return 'file://' + str(root)


def _loader(cls, url, batch_size=10, reader_kwargs=None, **kwargs):
    reader_kwargs = {'reader_pool_type': 'dummy', 'shuffle_row_groups': False, **(reader_kwargs or {})}
    if cls is InMemBatchedDataLoader:
        kwargs.setdefault('rows_capacity', 1000)
    return cls(make_batch_reader(url, **reader_kwargs), batch_size=batch_size, **kwargs)


def _ids(batches):
    return [int(v) for batch in batches for v in batch['id']]


# -- drop_last ------------------------------------------------------------------------------------------------

@pytest.mark.parametrize('cls', LOADERS)
@pytest.mark.parametrize('drop_last', [False, True])
def test_drop_last_leaves_out_the_short_batch_and_len_says_so(plain_url, cls, drop_last):
    with _loader(cls, plain_url, batch_size=10, drop_last=drop_last) as loader:
        expected = 10 if drop_last else 11
        assert len(loader) == expected
        batches = list(loader)
    assert len(batches) == expected
    sizes = [len(b['id']) for b in batches]
    assert sizes == [10] * 10 + ([] if drop_last else [3])
    assert _ids(batches) == list(range(100 if drop_last else ROWS))


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader])
def test_drop_last_with_a_shuffling_buffer_gives_full_batches_of_distinct_rows(plain_url, cls):
    with _loader(cls, plain_url, batch_size=8, drop_last=True, shuffling_queue_capacity=30,
                 reader_kwargs={'seed': 3, 'num_epochs': 2}) as loader:
        assert len(loader) == 2 * ROWS // 8
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [8] * (2 * ROWS // 8)
    ids = _ids(batches)
    assert len(ids) == 2 * ROWS - 2 * ROWS % 8
    assert max(np.bincount(ids)) <= 2


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader])
def test_drop_last_pass_ends_with_its_last_full_batch_for_trainers(plain_url, cls):
    # A trainer takes len() batches and calls iter() again: the pass was whole, so the position saved then is
    # between passes, and the next iter() reads the next epoch from its first row.
    with _loader(cls, plain_url, batch_size=10, drop_last=True, reader_kwargs={'num_epochs': 1}) as loader:
        it = iter(loader)
        first = [next(it) for _ in range(len(loader))]
        state = loader.state_dict()
        assert state['in_progress'] is False
        assert state['passes_done'] == 1
        again = list(loader)
    assert _ids(first) == _ids(again) == list(range(100))


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader])
def test_drop_last_resumed_mid_pass_delivers_the_rest_of_its_full_batches(plain_url, cls):
    with _loader(cls, plain_url, batch_size=10, drop_last=True) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(4)]
        state = loader.state_dict()
    with _loader(cls, plain_url, batch_size=10, drop_last=True) as restored:
        restored.load_state_dict(state)
        assert len(restored) == 10  # the batches of a whole pass, as trainers count them
        rest = list(restored)
    assert [len(b['id']) for b in rest] == [10] * 6
    assert _ids(head) + _ids(rest) == list(range(100))


def test_inmem_drop_last_applies_to_every_epoch(plain_url):
    with _loader(InMemBatchedDataLoader, plain_url, batch_size=25, drop_last=True, num_epochs=3, shuffle=True,
                 seed=1) as loader:
        assert len(loader) == 3 * 4
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [25] * 12
    epochs = [sorted(_ids(batches[4 * e:4 * e + 4])) for e in range(3)]
    assert all(len(set(epoch)) == 100 for epoch in epochs)
    assert len({tuple(epoch) for epoch in epochs}) > 1  # the rows left out change with the epoch's order


@pytest.mark.parametrize('cls', LOADERS)
def test_drop_last_with_equal_row_shards_gives_every_rank_the_same_full_batches(plain_url, cls):
    counts, seen = [], []
    for rank in range(3):
        with _loader(cls, plain_url, batch_size=4, drop_last=True,
                     reader_kwargs={'cur_shard': rank, 'shard_count': 3, 'shard_mode': 'rows', 'seed': 5,
                                    'shard_remainder': 'drop_last', 'shuffle_row_groups': True}) as loader:
            announced = len(loader)
            batches = list(loader)
        assert announced == len(batches)
        assert all(len(b['id']) == 4 for b in batches)
        counts.append(len(batches))
        seen += _ids(batches)
    assert counts == [8] * 3  # 34 rows per rank (103 = 3 * 34 + 1, one left out), 8 full batches each
    assert len(set(seen)) == len(seen)


# -- torch's own arguments ------------------------------------------------------------------------------------

@pytest.mark.parametrize('cls', LOADERS)
@pytest.mark.parametrize(('argument', 'value', 'named'), [
    ('num_workers', 2, 'workers_count'),
    ('sampler', object(), "shard_mode='rows'"),
    ('batch_sampler', object(), 'shuffling_queue_capacity'),
    ('prefetch_factor', 4, 'results_queue_size'),
    ('persistent_workers', True, 'next pass'),
    ('worker_init_fn', print, 'TransformSpec'),
    ('generator', object(), 'seed='),
])
def test_torch_arguments_name_our_equivalent(plain_url, cls, argument, value, named):
    reader = make_batch_reader(plain_url, reader_pool_type='thread', workers_count=2)
    with pytest.raises(LoaderArgumentError, match=f'does not take torch.s {argument}=.*{named}') as caught:
        cls(reader, batch_size=8, **{argument: value})
    assert isinstance(caught.value, TypeError)
    assert reader.stopped  # the loader owned the reader: it is stopped and joined
    assert not [t for t in threading.enumerate() if t.name.startswith('petastorm-worker')]


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader])
def test_shuffle_true_names_the_shuffling_arguments(plain_url, cls):
    with pytest.raises(TypeError, match='shuffle=True.*shuffle_rows=True.*shuffling_queue_capacity=N'):
        _loader(cls, plain_url, shuffle=True)


@pytest.mark.parametrize('cls', LOADERS)
def test_torch_defaults_are_accepted(plain_url, cls):
    defaults = {'num_workers': 0, 'sampler': None, 'timeout': 0, 'persistent_workers': False, 'in_order': True}
    if cls is not InMemBatchedDataLoader:
        defaults['shuffle'] = False
    with _loader(cls, plain_url, batch_size=50, **defaults) as loader:
        assert len(list(loader)) == 3


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader])
def test_a_loader_re_created_from_its_attributes_as_trainers_do(plain_url, cls):
    import inspect

    loader = _loader(cls, plain_url, batch_size=8, drop_last=True)
    names = [*inspect.signature(cls.__init__).parameters, *inspect.signature(torch.utils.data.DataLoader).parameters]
    arguments = {name: getattr(loader, name) for name in names if name != 'self' and hasattr(loader, name)}
    assert {'dataset', 'sampler', 'batch_sampler', 'collate_fn', 'num_workers', 'reader'} <= set(arguments)
    with cls(**arguments) as again:  # torch's own values for its arguments, this loader's .dataset and reader
        assert len(list(again)) == 12


def test_unknown_arguments_are_still_type_errors(plain_url):
    with pytest.raises(TypeError, match="unexpected keyword argument 'bacth_size'"):
        _loader(DataLoader, plain_url, bacth_size=3)


@pytest.mark.parametrize('cls', [DataLoader, BatchedDataLoader, InMemBatchedDataLoader])
def test_torchs_positional_shuffle_is_caught(plain_url, cls):
    reader = make_batch_reader(plain_url, reader_pool_type='dummy')
    with pytest.raises(LoaderArgumentError, match='must be a function, got True.*third positional argument is '
                                                  'shuffle'):
        cls(reader, 8, True)
    assert reader.stopped


@pytest.mark.parametrize('cls', LOADERS)
def test_an_ngram_reader_is_refused_when_the_loader_is_made_naming_that_loader(url, cls):
    reader = make_reader(url, schema_fields=NGram({0: ['id'], 1: ['id']}, 1, 'id'), reader_pool_type='dummy')
    with pytest.raises(NotImplementedError, match=f'^{cls.__name__} does not read NGram windows .*iterate the '
                                                  f'reader itself'):
        cls(reader, batch_size=4)
    assert reader.stopped


@pytest.mark.parametrize('cls', LOADERS)
def test_batch_transform_fn_gets_every_collated_batch_and_its_result_is_handed_over(plain_url, cls):
    seen = []

    def normalise(batch):
        seen.append(len(batch['id']))
        return {**batch, 'x': (batch['x'] - 25.0) / 5.0, 'count': len(seen)}

    with _loader(cls, plain_url, batch_size=25, batch_transform_fn=normalise) as loader:
        batches = list(loader)
    assert seen == [25, 25, 25, 25, 3], 'once per batch, after collation'
    assert [b['count'] for b in batches] == [1, 2, 3, 4, 5]
    assert torch.allclose(batches[0]['x'].double(), (batches[0]['id'].double() / 2 - 25) / 5)
    with pytest.raises(LoaderArgumentError, match='batch_transform_fn must be a function'):
        _loader(cls, plain_url, batch_transform_fn='normalise')


def test_a_batched_loader_names_itself_in_its_messages(plain_url):
    loader = _loader(BatchedDataLoader, plain_url)
    live = iter(loader)
    next(live)
    next(iter(loader))
    with pytest.raises(RuntimeError, match='iterator of the BatchedDataLoader was superseded'):
        next(live)


@pytest.mark.parametrize('cls', [BatchedDataLoader, InMemBatchedDataLoader])
def test_collate_fn_on_a_batched_loader_points_at_transform_fn(plain_url, cls):
    with pytest.raises(LoaderArgumentError, match='collate_fn=.*transform_fn=.*petastorm.pytorch.DataLoader'):
        _loader(cls, plain_url, collate_fn=lambda rows: rows)


# -- bool fields ----------------------------------------------------------------------------------------------

def _first_batch(cls, url, **kwargs):
    reader = make_reader(url, reader_pool_type='dummy', shuffle_row_groups=False)
    extra = {'rows_capacity': 1000} if cls is InMemBatchedDataLoader else {}
    with cls(reader, batch_size=4, **extra, **kwargs) as loader:
        return next(iter(loader))


@pytest.mark.parametrize('cls', LOADERS)
def test_bools_are_uint8_by_default_as_in_petastorm_and_bool_on_request(url, cls):
    default = _first_batch(cls, url)
    assert default['flag'].dtype == torch.uint8
    assert default['mask'].dtype == torch.uint8
    real = _first_batch(cls, url, bool_dtype=torch.bool)
    assert real['flag'].dtype == torch.bool
    assert real['mask'].dtype == torch.bool
    assert real['flag'].tolist() == [True, False, True, False]
    assert real['mask'][:, 1].all()
    assert not real['mask'][:, 2].any()
    assert real['id'].dtype == torch.int64


def test_bool_dtype_reaches_a_custom_collate_fn(url):
    batch = _first_batch(DataLoader, url, bool_dtype=torch.bool, collate_fn=lambda rows: rows)
    assert batch[0]['flag'].dtype == np.bool_
    assert batch[0]['mask'].dtype == np.bool_
    batch = _first_batch(DataLoader, url, collate_fn=lambda rows: rows)
    assert batch[0]['flag'].dtype == np.uint8


def test_bool_dtype_must_be_a_torch_dtype_we_know(url):
    with pytest.raises(ValueError, match='bool_dtype must be torch.uint8 .* or torch.bool, got torch.float32'):
        _first_batch(DataLoader, url, bool_dtype=torch.float32)


# -- len() of filtered and split readers ----------------------------------------------------------------------

def test_filters_the_statistics_decide_give_len_without_counting(plain_url):
    # Row groups of 10 sorted ids: id < 30 keeps three whole row groups and drops the others.
    with _loader(DataLoader, plain_url, reader_kwargs={'filters': [('id', '<', 30)]}) as loader:
        assert len(loader) == 3
        assert loader.reader.num_rows_per_epoch == 30
        assert _ids(loader) == list(range(30))


def test_filters_that_cut_a_row_group_need_count_rows(plain_url):
    with _loader(DataLoader, plain_url, reader_kwargs={'filters': [('id', '<', 35)]}) as loader, \
            pytest.raises(TypeError, match='count_rows=True'):
        len(loader)
    with _loader(DataLoader, plain_url, batch_size=10, drop_last=True,
                 reader_kwargs={'filters': [('id', '<', 35)], 'count_rows': True, 'num_epochs': 2}) as loader:
        assert loader.reader.num_rows_per_pass == 70
        assert len(loader) == 7 == len(list(loader))


@pytest.mark.parametrize('factory', [make_reader, make_batch_reader])
def test_a_pseudorandom_split_counted_once_gives_train_and_validation_lengths(url, factory):
    def split(index):
        return factory(url, predicate=in_pseudorandom_split([0.8, 0.2], index, 'id'), count_rows=True,
                       reader_pool_type='thread', workers_count=2, shuffle_rows=True, seed=2)

    with DataLoader(split(0), batch_size=8) as train, DataLoader(split(1), batch_size=8) as validation:
        counts = (train.reader.num_rows_per_epoch, validation.reader.num_rows_per_epoch)
        assert sum(counts) == ROWS
        assert min(counts) > 0
        for _ in range(2):  # train an epoch, then validate; each loop resets its reader
            train_ids, validation_ids = _ids(train), _ids(validation)
            assert (len(train), len(validation)) == (math.ceil(counts[0] / 8), math.ceil(counts[1] / 8))
            assert (len(train_ids), len(validation_ids)) == counts
            assert sorted(train_ids + validation_ids) == list(range(ROWS))


def test_counted_rows_under_row_shards_are_exact_for_every_rank(plain_url):
    lengths, delivered = [], []
    for rank in range(2):
        reader = make_batch_reader(plain_url, predicate=in_lambda(['id'], lambda ids: ids % 3 == 0),
                                   count_rows=True, cur_shard=rank, shard_count=2, shard_mode='rows', seed=4,
                                   shuffle_rows=True, reader_pool_type='dummy', num_epochs=2)
        with DataLoader(reader, batch_size=5) as loader:
            lengths.append(reader.num_rows_per_pass)
            delivered.append(len(_ids(loader)))
    assert lengths == delivered
    assert sum(delivered) >= 2 * 35


def test_count_rows_refuses_what_it_cannot_count(url):
    with pytest.raises(ValueError, match='count_rows=True cannot count the rows of an NGram'):
        make_reader(url, schema_fields=NGram({0: ['id'], 1: ['id']}, 1, 'id'), count_rows=True,
                    predicate=in_lambda(['id'], lambda i: i > 3))
    with pytest.raises(ValueError, match='count_rows must be True or False'):
        make_reader(url, count_rows='yes')
