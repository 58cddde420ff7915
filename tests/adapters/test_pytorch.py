"""petastorm.pytorch: the three loaders over both reader kinds, collation, shuffling, iteration rules, the example."""

import decimal
import importlib.util
import math
import pathlib
import threading

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

torch = pytest.importorskip('torch')

from petastorm import TransformSpec, make_batch_reader, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import NdarrayCodec, ScalarCodec  # noqa: E402
from petastorm.predicates import in_lambda  # noqa: E402
from petastorm.pytorch import (  # noqa: E402
    BatchedDataLoader,
    DataLoader,
    InMemBatchedDataLoader,
    _sanitize_pytorch_types,
    decimal_friendly_collate,
)
from petastorm.shuffle import Batcher, ShufflingBuffer, compiled_shuffle_in_use  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]

ROWS = 50
Schema = Unischema('TorchSchema', [
    UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
    UnischemaField('small', np.uint16, (), ScalarCodec(pa.uint16()), False),
    UnischemaField('flag', np.bool_, (), ScalarCodec(pa.bool_()), False),
    UnischemaField('weight', np.float64, (), ScalarCodec(pa.float64()), False),
    UnischemaField('name', np.str_, (), ScalarCodec(pa.string()), False),
    UnischemaField('price', decimal.Decimal, (), ScalarCodec(pa.decimal128(10, 2)), False),
    UnischemaField('matrix', np.float32, (2, 3), NdarrayCodec(), False),
    UnischemaField('seq', np.int64, (None,), NdarrayCodec(), False),
])
NUMERIC = ['id', 'small', 'flag', 'weight', 'matrix']


def _row(i):
    return {'id': i, 'small': 1000 + i, 'flag': i % 3 == 0, 'weight': i / 4, 'name': f'row{i}',
            'price': decimal.Decimal(f'{i}.25'), 'matrix': np.full((2, 3), i, dtype=np.float32),
            'seq': np.arange(i % 4 + 1, dtype=np.int64)}


@pytest.fixture(scope='module')
def url(tmp_path_factory):
    target = 'file://' + str(tmp_path_factory.mktemp('torch') / 'ds')
    write_dataset(target, Schema, (_row(i) for i in range(ROWS)), row_group_size_mb=0.002)
    return target


@pytest.fixture(scope='module')
def plain_url(tmp_path_factory):
    """A plain Parquet store (no petastorm metadata) of 300 rows in 6 row groups."""
    root = tmp_path_factory.mktemp('plain')
    n = 300
    table = pa.table({'id': np.arange(n, dtype=np.int64), 'x': np.arange(n, dtype=np.float32) / 2,
                      'u': np.arange(n, dtype=np.uint32), 'label': [f'l{i % 7}' for i in range(n)]})
    pq.write_table(table, str(root / 'part0.parquet'), row_group_size=50)
    return 'file://' + str(root)


def _reader(url, **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    kwargs.setdefault('shuffle_row_groups', False)
    return make_reader(url, **kwargs)


def _batch_reader(url, **kwargs):
    kwargs.setdefault('reader_pool_type', 'dummy')
    kwargs.setdefault('shuffle_row_groups', False)
    return make_batch_reader(url, **kwargs)


def _ids(batches, key='id'):
    return [int(v) for batch in batches for v in batch[key]]


def _assert_same_batch(a, b):
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor)
        assert a.dtype == b.dtype
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same_batch(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same_batch(x, y)
    else:
        assert type(a) is type(b)
        assert a == b


# -- DataLoader ---------------------------------------------------------------------------------------------------

def test_dataloader_rows_values_dtypes_and_shapes(url):
    with DataLoader(_reader(url), batch_size=8) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [8] * 6 + [2]
    assert _ids(batches) == list(range(ROWS))
    first = batches[0]
    assert list(first) == list(Schema.fields)
    assert first['id'].dtype == torch.int32
    assert first['small'].dtype == torch.int32
    assert first['small'].tolist() == list(range(1000, 1008))
    assert first['flag'].dtype == torch.uint8
    assert first['flag'].tolist() == [1, 0, 0, 1, 0, 0, 1, 0]
    assert first['weight'].dtype == torch.float64
    assert first['matrix'].shape == (8, 2, 3)
    assert first['matrix'].dtype == torch.float32
    assert first['name'] == [f'row{i}' for i in range(8)]
    assert first['price'] == [decimal.Decimal(f'{i}.25') for i in range(8)]
    assert [t.tolist() for t in first['seq']] == [list(range(i % 4 + 1)) for i in range(8)]


def test_columnar_batches_equal_collating_the_rows(url):
    """The fast path gives what decimal_friendly_collate gives on the reader's rows, batch for batch."""
    with DataLoader(_reader(url), batch_size=7) as fast:
        fast_batches = list(fast)
    with DataLoader(_reader(url), batch_size=7, collate_fn=lambda rows: decimal_friendly_collate(rows)) as slow:
        slow_batches = list(slow)
    with _reader(url) as reader:
        rows = [row._asdict() for row in reader]
    for row in rows:
        _sanitize_pytorch_types({k: v for k, v in row.items() if k not in ('name', 'price')})
    reference = [decimal_friendly_collate(rows[i:i + 7]) for i in range(0, ROWS, 7)]
    assert len(fast_batches) == len(slow_batches) == len(reference) == math.ceil(ROWS / 7)
    for a, b in zip(fast_batches, slow_batches, strict=True):
        _assert_same_batch(a, b)
    for a, b in zip(fast_batches, reference, strict=True):
        for key in ('id', 'weight', 'matrix', 'name', 'price'):
            _assert_same_batch(a[key], b[key])


def test_dataloader_batch_reader_and_strings(plain_url):
    with DataLoader(_batch_reader(plain_url), batch_size=64) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [64] * 4 + [44]
    assert _ids(batches) == list(range(300))
    assert batches[0]['x'].dtype == torch.float32
    assert batches[0]['id'].dtype == torch.int64
    assert batches[0]['u'].dtype == torch.int64  # uint32 -> int64
    assert batches[0]['label'][:3] == ['l0', 'l1', 'l2']


def test_custom_collate_receives_row_dicts(url):
    seen = []

    def collate(rows):
        seen.append(rows)
        return len(rows)

    with DataLoader(_reader(url, schema_fields=['id', 'small']), batch_size=20, collate_fn=collate) as loader:
        assert list(loader) == [20, 20, 10]
    assert set(seen[0][0]) == {'id', 'small'}
    assert seen[0][0]['small'].dtype == np.int32


def test_tuple_transform_gives_positional_batches(url):
    def to_tuple(row):
        return torch.as_tensor(row['matrix']).unsqueeze(0), row['id']

    spec = TransformSpec(to_tuple, removed_fields=[n for n in Schema.fields if n not in ('id', 'matrix')])
    with DataLoader(_reader(url, transform_spec=spec), batch_size=16) as loader:
        batches = list(loader)
    images, ids = batches[0]
    assert isinstance(batches[0], list)
    assert images.shape == (16, 1, 2, 3)
    assert images.dtype == torch.float32
    assert ids.dtype == torch.int32
    assert ids.tolist() == list(range(16))
    with BatchedDataLoader(_reader(url, transform_spec=spec), batch_size=16) as loader:
        images, ids = next(iter(loader))
    assert images.shape == (16, 1, 2, 3)
    assert ids.tolist() == list(range(16))
    loader = InMemBatchedDataLoader(_reader(url, transform_spec=spec), batch_size=25, rows_capacity=100)
    assert [len(ids) for _, ids in loader] == [25, 25]


def test_variable_length_pad_policy(url):
    with DataLoader(_reader(url, schema_fields=['id', 'seq']), batch_size=5, variable_length='pad',
                    padding_value=-1) as loader:
        batches = list(loader)
    for batch in batches:
        lengths = [int(i) % 4 + 1 for i in batch['id']]
        padded, mask = batch['seq'], batch['seq_mask']
        assert padded.shape == (len(lengths), max(lengths))
        assert mask.dtype == torch.bool
        assert mask.sum(dim=1).tolist() == lengths
        assert (padded[~mask] == -1).all()
        assert padded[0, :lengths[0]].tolist() == list(range(lengths[0]))
    with pytest.raises(ValueError, match='variable_length'):
        DataLoader(_reader(url), variable_length='stack')


def test_decimal_friendly_collate():
    assert decimal_friendly_collate([dict()]) == {}
    batch = decimal_friendly_collate([{'d': decimal.Decimal('1.5'), 's': 'a', 'n': np.int16(1), 't': (1, 2.0)},
                                      {'d': decimal.Decimal('2'), 's': 'b', 'n': np.int16(2), 't': (3, 4.0)}])
    assert batch['d'] == [decimal.Decimal('1.5'), decimal.Decimal('2')]
    assert batch['s'] == ['a', 'b']
    assert batch['n'].dtype == torch.int16
    assert batch['n'].tolist() == [1, 2]
    assert batch['t'][0].tolist() == [1, 3]
    assert batch['t'][1].dtype == torch.float64
    ragged = decimal_friendly_collate([np.zeros(2), np.zeros(3)])
    assert [t.shape for t in ragged] == [(2,), (3,)]
    assert decimal_friendly_collate([np.array(['a', 'b']), np.array(['c', 'd'])])[1].tolist() == ['c', 'd']
    assert decimal_friendly_collate([b'x', b'y']) == [b'x', b'y']
    # Rows given as sequences: each position's uncollatable values stay the tuple zip made of them, as in the
    # original; numbers still become tensors.
    decimals, numbers = decimal_friendly_collate(([decimal.Decimal('1.0'), 1], [decimal.Decimal('1.1'), 2]))
    assert decimals == (decimal.Decimal('1.0'), decimal.Decimal('1.1'))
    assert numbers.tolist() == [1, 2]


def test_sanitize_refuses_strings_and_none():
    row = {'a': np.array([1], dtype=np.uint16), 'b': np.bool_(True)}
    _sanitize_pytorch_types(row)
    assert row['a'].dtype == np.int32
    assert row['b'].dtype == np.uint8
    with pytest.raises(TypeError, match='Pytorch does not support arrays of string or object classes. Found in '
                                        'field s.'):
        _sanitize_pytorch_types({'s': np.array(['x'])})
    with pytest.raises(TypeError, match='Pytorch does not support nullable fields. Found None in n'):
        _sanitize_pytorch_types({'n': None})


def test_none_values_raise_naming_the_field(tmp_path):
    schema = Unischema('Nullable', [UnischemaField('id', np.int32, (), ScalarCodec(pa.int32()), False),
                                    UnischemaField('maybe', np.float32, (), ScalarCodec(pa.float32()), True)])
    target = 'file://' + str(tmp_path / 'n')
    write_dataset(target, schema, ({'id': i, 'maybe': None if i == 3 else 1.0} for i in range(6)))
    with DataLoader(_reader(target), batch_size=6) as loader, \
            pytest.raises(TypeError, match='Pytorch does not support nullable fields. Found None in maybe'):
        next(iter(loader))


def test_shuffling_buffer_keeps_rows_and_is_reproducible(url):
    def run(seed):
        reader = _reader(url, schema_fields=['id', 'matrix', 'name'], seed=seed)
        with DataLoader(reader, batch_size=10, shuffling_queue_capacity=20) as loader:
            batches = list(loader)
        for batch in batches:
            assert batch['matrix'][:, 0, 0].long().tolist() == batch['id'].tolist()
            assert batch['name'] == [f'row{i}' for i in batch['id'].tolist()]
        return _ids(batches)

    first, again, other = run(7), run(7), run(8)
    assert sorted(first) == list(range(ROWS))
    assert first != list(range(ROWS))
    assert first == again
    assert first != other


def _cut(batcher, table):
    """Queue ``table`` in ``batcher`` and return the full batches it can now make."""
    batcher.put(table)
    return list(batcher.batches())


def test_tensor_buffers_for_accelerator_devices():
    """The tensor path BatchedDataLoader uses on a non-CPU device, exercised with CPU tensors."""
    from petastorm.pytorch._tensors import TensorOps

    ops = TensorOps('cpu')
    buffer = ShufflingBuffer(8, np.random.default_rng(0), ops)
    drawn = []
    for start, stop in ((0, 5), (5, 12), (12, 15)):
        ids = torch.arange(start, stop)
        for out in buffer.add({'i': ids, 'm': torch.stack([ids, ids * 2], dim=1)}):
            assert torch.equal(out['m'][:, 1], out['i'] * 2)
            drawn.append(out['i'])
    drawn.extend(out['i'] for out in buffer.drain())
    assert sorted(torch.cat(drawn).tolist()) == list(range(15))
    batcher = Batcher(4, ops)
    batches = _cut(batcher, {'x': torch.arange(3)}) + _cut(batcher, {'x': torch.arange(3, 9)})
    assert [b['x'].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    with pytest.raises(TypeError, match="column 'x' changes"):
        ops.concat('x', [torch.zeros(2), torch.zeros(2, dtype=torch.int64)])


def test_load_rows_into_mem(url):
    from petastorm.pytorch import _load_rows_into_mem

    with _reader(url, schema_fields=['id', 'matrix']) as reader, pytest.warns(UserWarning, match='rows_capacity'):
        keys, columns = _load_rows_into_mem(reader, None, 20)
    assert keys == ['id', 'matrix']
    assert columns[0].tolist() == list(range(20))
    assert columns[1].shape == (20, 2, 3)


def test_a_failed_pass_is_not_restarted(url):
    # A new iter() after a finished or abandoned pass starts over: tests/reading/test_loader_passes.py.
    calls = []

    def failing(rows):
        calls.append(1)
        if len(calls) == 2:
            raise ValueError('collate failed')
        return rows

    with DataLoader(_reader(url, schema_fields=['id']), batch_size=8, collate_fn=failing) as loader:
        with pytest.raises(ValueError, match='collate failed'):
            list(loader)
        with pytest.raises(RuntimeError, match='Cannot start a new iteration because last time iteration failed'):
            next(iter(loader))


def test_len_and_isinstance(url):
    reader = _reader(url, num_epochs=3)
    assert reader.num_rows_per_pass == 3 * ROWS
    with DataLoader(reader, batch_size=8) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert len(loader) == math.ceil(3 * ROWS / 8) == len(list(loader))
        assert loader.batch_size == 8
    with DataLoader(_reader(url, num_epochs=None), batch_size=8) as loader, pytest.raises(TypeError):
        len(loader)
    predicate = in_lambda(['id'], lambda i: i < 10)
    with DataLoader(_reader(url, predicate=predicate), batch_size=8) as loader, pytest.raises(TypeError):
        len(loader)
    with BatchedDataLoader(_reader(url, schema_fields=NUMERIC), batch_size=16) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert len(loader) == 4
    loader = InMemBatchedDataLoader(_reader(url, schema_fields=['id']), batch_size=16, num_epochs=2, rows_capacity=99)
    assert isinstance(loader, torch.utils.data.DataLoader)
    assert len(loader) == 8 == len(list(loader))


def test_context_manager_stops_reader_without_leaking_threads(url):
    before = set(threading.enumerate())
    reader = make_reader(url, reader_pool_type='thread', workers_count=3, schema_fields=['id'])
    with DataLoader(reader, batch_size=4) as loader:
        next(iter(loader))
    assert reader.stopped
    assert set(threading.enumerate()) <= before
    with pytest.raises(RuntimeError):
        next(reader)


def test_process_pool_reader(url):
    reader = make_reader(url, reader_pool_type='process', workers_count=1, schema_fields=['id', 'matrix'],
                         shuffle_row_groups=False)
    with DataLoader(reader, batch_size=25) as loader:
        batches = list(loader)
    assert _ids(batches) == list(range(ROWS))
    batches[0]['matrix'] += 1  # batches own writable memory


def test_reader_without_column_batches_weighted_sampling(url):
    from petastorm.weighted_sampling_reader import WeightedSamplingReader

    readers = [_reader(url, schema_fields=['id', 'matrix'], seed=s) for s in (1, 2)]
    with DataLoader(WeightedSamplingReader(readers, [0.5, 0.5], seed=3), batch_size=10) as loader:
        batches = list(loader)
    ids = _ids(batches)
    assert len(ids) >= ROWS
    assert set(ids) <= set(range(ROWS))
    assert batches[0]['id'].dtype == torch.int32
    assert batches[0]['matrix'].shape == (10, 2, 3)
    for reader in readers:
        assert reader.stopped


def test_pin_memory_without_accelerator_warns(url):
    if torch.cuda.is_available():
        pytest.skip('an accelerator is available')
    with pytest.warns(UserWarning, match='pin_memory=True needs an accelerator'):
        loader = DataLoader(_reader(url, schema_fields=['id']), batch_size=8, pin_memory=True)
    with loader:
        assert len(list(loader)) == 7


# -- BatchedDataLoader --------------------------------------------------------------------------------------------

def test_batched_loader_batch_reader(plain_url):
    reader = _batch_reader(plain_url, schema_fields=['id', 'x', 'u'])
    with BatchedDataLoader(reader, batch_size=64) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [64] * 4 + [44]
    assert _ids(batches) == list(range(300))
    assert batches[0]['x'].dtype == torch.float32
    assert batches[0]['u'].dtype == torch.int64
    assert torch.equal(batches[1]['x'], torch.arange(64, 128, dtype=torch.float32) / 2)


def test_batched_loader_shuffles_reproducibly(plain_url):
    def run(seed, **kwargs):
        reader = _batch_reader(plain_url, schema_fields=['id', 'x'], seed=seed)
        with BatchedDataLoader(reader, batch_size=32, shuffling_queue_capacity=100, **kwargs) as loader:
            batches = list(loader)
        for batch in batches:
            assert torch.equal(batch['x'], batch['id'].float() / 2)
        return _ids(batches)

    first = run(1)
    assert sorted(first) == list(range(300))
    assert first != list(range(300))
    assert first == run(1)
    assert first != run(2)
    assert run(1, transform_fn=torch.as_tensor) == first


def test_batched_loader_make_reader_and_transform_fn(url):
    with BatchedDataLoader(_reader(url, schema_fields=NUMERIC), batch_size=20,
                           transform_fn=lambda column: torch.as_tensor(np.array(column)) * 2) as loader:
        batches = list(loader)
    assert _ids(batches) == [2 * i for i in range(ROWS)]
    assert batches[0]['matrix'].shape == (20, 2, 3)
    assert batches[0]['flag'].dtype == torch.uint8


def test_batched_loader_refuses_strings_and_decimals(url):
    reader = _reader(url)
    with pytest.raises(TypeError, match=r'string or Decimal fields: name \(str_\), price \(Decimal\)'):
        BatchedDataLoader(reader, batch_size=4)
    assert reader.stopped
    with BatchedDataLoader(_reader(url, schema_fields=['id', 'seq']), batch_size=8,
                           variable_length='nested') as loader:
        batch = next(iter(loader))  # arrays of varying length: a ragged dimension, not an error
    assert [row.tolist() for row in batch['seq'].unbind()] == [list(range(i % 4 + 1)) for i in batch['id'].tolist()]


def _label_to_int_rows(row):
    row['label'] = int(row['label'][1:])  # a string field becomes an int; edit_fields does not say so
    return row


def _label_to_int_frame(frame):
    frame['label'] = frame['label'].str[1:].astype('int64')
    return frame


@pytest.mark.parametrize('loader_cls', [BatchedDataLoader, InMemBatchedDataLoader])
@pytest.mark.parametrize('reader_kind', ['rows', 'batches'])
def test_batched_loaders_judge_types_by_what_the_transform_returns(plain_url, loader_cls, reader_kind):
    if reader_kind == 'rows':
        reader = make_reader(plain_url, reader_pool_type='dummy', shuffle_row_groups=False,
                             schema_fields=['id', 'label'], transform_spec=TransformSpec(_label_to_int_rows))
    else:
        reader = _batch_reader(plain_url, schema_fields=['id', 'label'],
                               transform_spec=TransformSpec(_label_to_int_frame))
    kwargs = {'num_epochs': 1, 'rows_capacity': 300} if loader_cls is InMemBatchedDataLoader else {}
    with loader_cls(reader, batch_size=100, **kwargs) as loader:
        batches = list(loader)
    ids = torch.cat([b['id'] for b in batches])
    labels = torch.cat([b['label'] for b in batches])
    assert labels.dtype == torch.int64
    assert torch.equal(labels, ids % 7)
    # A transform that leaves the strings as they are is still refused, naming the field, at the first batch.
    reader = _batch_reader(plain_url, schema_fields=['id', 'label'], transform_spec=TransformSpec(lambda f: f))
    with pytest.raises(TypeError, match="field 'label'"), loader_cls(reader, batch_size=100, **kwargs) as loader:
        list(loader)


def _shuffled_loaders(url, plain_url):
    """Each loader kind with shuffling, seeded: what must give the same batches with and without the kernel."""
    return {
        'DataLoader': lambda: DataLoader(_reader(url, schema_fields=['id', 'matrix', 'name'], seed=5), batch_size=7,
                                         shuffling_queue_capacity=20),
        'BatchedDataLoader': lambda: BatchedDataLoader(_reader(url, schema_fields=NUMERIC, seed=5), batch_size=7,
                                                       shuffling_queue_capacity=20),
        'BatchedDataLoader batch reader': lambda: BatchedDataLoader(
            _batch_reader(plain_url, schema_fields=['id', 'x', 'u'], seed=5), batch_size=32,
            shuffling_queue_capacity=100),
        'InMemBatchedDataLoader': lambda: InMemBatchedDataLoader(
            _batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=32, num_epochs=2, seed=5,
            rows_capacity=1000, shuffle=True),
    }


@pytest.mark.parametrize('kind', ['DataLoader', 'BatchedDataLoader', 'BatchedDataLoader batch reader',
                                  'InMemBatchedDataLoader'])
def test_shuffled_batches_are_the_same_with_and_without_the_compiled_kernel(url, plain_url, kind, monkeypatch):
    make = _shuffled_loaders(url, plain_url)[kind]
    runs = []
    for switched_off in ('0', '1'):
        monkeypatch.setenv('PETASTORM_NO_COMPILED_SHUFFLE', switched_off)
        assert compiled_shuffle_in_use() == (switched_off == '0' and
                                             importlib.util.find_spec('petastorm.shuffle._kernel') is not None)
        with make() as loader:
            runs.append(list(loader))
    with_kernel, without = runs
    assert len(with_kernel) == len(without)
    for a, b in zip(with_kernel, without, strict=True):
        _assert_same_batch(a, b)
    ids = _ids(with_kernel)
    assert ids != sorted(ids)


# -- InMemBatchedDataLoader ---------------------------------------------------------------------------------------

def test_inmem_loader_epochs_and_shuffling(plain_url):
    reader = _batch_reader(plain_url, schema_fields=['id', 'x'])
    loader = InMemBatchedDataLoader(reader, batch_size=64, num_epochs=3, seed=5, rows_capacity=1000, shuffle=True)
    assert reader.stopped
    batches = list(loader)
    assert len(batches) == 3 * 5 == len(loader)
    epochs = [_ids(batches[i * 5:(i + 1) * 5]) for i in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(300))
        assert epoch != list(range(300))
    assert epochs[0] != epochs[1]
    for batch in batches:
        assert torch.equal(batch['x'], batch['id'].float() / 2)
    # A finished iteration: another one serves the next 3 epochs (seeded 5 + 3, 5 + 4, 5 + 5). Before, a second
    # iteration raised even after the first ended, which trainers that iterate once per epoch cannot live with.
    more = list(loader)
    assert [sorted(_ids(more[i * 5:(i + 1) * 5])) for i in range(3)] == [list(range(300))] * 3
    assert _ids(more[:5]) not in epochs
    live = iter(loader)
    next(live)
    with pytest.raises(RuntimeError, match="InMemBatchedDataLoader couldn't be used multiple times"):
        next(iter(loader))
    again = InMemBatchedDataLoader(_batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=64,
                                   num_epochs=1, seed=5, rows_capacity=1000, shuffle=True)
    assert _ids(again) == epochs[0]


def test_inmem_loader_unshuffled_batches_are_copies_and_capacity_truncates(url):
    with pytest.warns(UserWarning, match='kept the first 30 rows'):
        loader = InMemBatchedDataLoader(_reader(url, schema_fields=['id', 'matrix']), batch_size=30,
                                        num_epochs=2, rows_capacity=30)
    first, second = list(loader)
    assert first['id'].tolist() == list(range(30))
    assert first['matrix'].shape == (30, 2, 3)
    first['id'] += 100
    assert second['id'].tolist() == list(range(30))



@pytest.mark.parametrize('shuffle', [True, False])
def test_inmem_epochs_gathered_in_chunks_follow_the_seeded_order(plain_url, monkeypatch, shuffle):
    import petastorm.pytorch._inmem as inmem

    monkeypatch.setattr(inmem, '_CHUNK_BYTES', 2 * 64 * 12)  # two 64-row batches of (id, x) rows per chunk
    loader = InMemBatchedDataLoader(_batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=64,
                                    num_epochs=2, seed=7, rows_capacity=1000, shuffle=shuffle)
    batches = list(loader)
    assert [len(b['id']) for b in batches] == [64, 64, 64, 64, 44] * 2
    for epoch in range(2):
        expected = torch.randperm(300, generator=torch.Generator().manual_seed(7 + epoch)).tolist() if shuffle \
            else list(range(300))
        assert _ids(batches[epoch * 5:(epoch + 1) * 5]) == expected
    for batch in batches:
        assert torch.equal(batch['x'], batch['id'].float() / 2)
        assert batch['id'].is_contiguous()
        assert batch['x'].is_contiguous()


def test_inmem_unknown_row_count_grows_and_tensor_columns(url):
    # A predicate hides the row count; a transform returning bfloat16 (no numpy dtype) keeps tensor columns.
    reader = _reader(url, schema_fields=['id', 'matrix'], predicate=in_lambda(['id'], lambda i: i % 5 != 0))
    assert reader.num_rows_per_pass is None
    loader = InMemBatchedDataLoader(reader, batch_size=7, rows_capacity=1000,
                                    transform_fn=lambda c: torch.as_tensor(c).to(torch.bfloat16))
    batches = list(loader)
    kept = [i for i in range(ROWS) if i % 5]
    assert [int(v) for b in batches for v in b['id']] == kept
    matrices = torch.cat([b['matrix'] for b in batches])
    assert matrices.dtype == torch.bfloat16
    assert matrices[:, 0, 0].float().tolist() == [float(i) for i in kept]


# -- the MNIST example --------------------------------------------------------------------------------------------

def _load_example(name):
    path = pathlib.Path(__file__).parents[2] / 'examples' / 'mnist' / f'{name}.py'
    spec = importlib.util.spec_from_file_location(f'mnist_example_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_mnist_example_trains_well_above_chance(tmp_path):
    pytest.importorskip('sklearn')
    generate = _load_example('generate_petastorm_mnist')
    example = _load_example('pytorch_example')
    dataset_url = 'file://' + str(tmp_path / 'mnist')
    counts = generate.generate(dataset_url)
    assert counts['train'] + counts['test'] == 1797
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny convolutions: one thread is fastest, and robust on a busy machine
    try:
        accuracy = example.run(dataset_url, epochs=3, lr=0.05, log_interval=0, device_name='cpu')
    finally:
        torch.set_num_threads(threads)
    assert accuracy > 0.7


# The PyTorch code block of the project's seed description, verbatim (trailing spaces stripped); only the dataset
# location is replaced.
SEED_BLOCK = '''
import torch
from petastorm.pytorch import DataLoader

torch.manual_seed(1)
device = torch.device('cpu')
model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.5)

def _transform_row(mnist_row):
    transform = transforms.Compose([
        transforms.ToTensor(),
        transforms.Normalize((0.1307,), (0.3081,))
    ])
    return (transform(mnist_row['image']), mnist_row['digit'])

transform = TransformSpec(_transform_row, removed_fields=['idx'])

with DataLoader(make_reader('file:///localpath/mnist/train', num_epochs=10,
                            transform_spec=transform, seed=1, shuffle_rows=True),
                batch_size=64) as train_loader:
    train(model, device, train_loader, 10, optimizer, 1)

with DataLoader(make_reader('file:///localpath/mnist/test', num_epochs=10,
                            transform_spec=transform),
                batch_size=1000) as test_loader:
    test(model, device, test_loader)
'''


def test_seed_pytorch_block_runs_unchanged(tmp_path, capsys):
    pytest.importorskip('sklearn')
    generate = _load_example('generate_petastorm_mnist')
    example = _load_example('pytorch_example')
    dataset_url = 'file://' + str(tmp_path / 'mnist')
    generate.generate(dataset_url, max_rows=200)
    namespace = {'Net': example.Net, 'train': example.train, 'test': example.test, 'transforms': example.transforms,
                 'TransformSpec': TransformSpec, 'make_reader': make_reader}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        exec(SEED_BLOCK.replace('file:///localpath/mnist', dataset_url), namespace)  # noqa: S102
    finally:
        torch.set_num_threads(threads)
    assert 'Test: mean loss' in capsys.readouterr().out


def test_torch_bench_quick_prints_its_table(tmp_path):
    import subprocess
    import sys

    script = pathlib.Path(__file__).parents[2] / 'benchmarks' / 'torch_bench.py'
    completed = subprocess.run([sys.executable, str(script), '--quick', '--cases', 'scalars,inmem', '--data-root',
                                str(tmp_path)], capture_output=True, text=True, timeout=240, check=False)
    assert completed.returncode == 0, completed.stderr
    rows = {line.split('|')[1].strip(): line for line in completed.stdout.splitlines() if line.startswith('| ')}
    assert 'scalars BatchedDataLoader bs1024' in rows
    assert 'scalars BatchedDataLoader bs1024 shufq100k' in rows
    assert 'mnist InMem shuffled epoch' in rows
    if compiled_shuffle_in_use():  # the numpy path, compared with the compiled shuffle
        numpy_row = rows['scalars BatchedDataLoader bs1024 shufq100k, numpy shuffle']
        assert '| scalars BatchedDataLoader bs1024 shufq100k |' in numpy_row


@pytest.mark.parametrize('loader_class', [DataLoader, BatchedDataLoader, InMemBatchedDataLoader])
@pytest.mark.parametrize('not_a_reader', ['file:///tmp/some/dataset', pathlib.Path('/tmp/some/dataset'),
                                          [{'id': 1}], torch.utils.data.TensorDataset(torch.zeros(2))])
def test_loaders_refuse_what_is_not_a_reader_before_reading(loader_class, not_a_reader):
    with pytest.raises(TypeError, match=f'{loader_class.__name__} takes a reader') as caught:
        loader_class(not_a_reader, batch_size=2)
    if isinstance(not_a_reader, (str, pathlib.Path)):
        assert f"{loader_class.__name__}(make_reader('/tmp/some/dataset'" in str(caught.value) or \
            f"{loader_class.__name__}(make_reader('file:///tmp/some/dataset'" in str(caught.value)
    else:
        assert type(not_a_reader).__name__ in str(caught.value)
        assert 'stop' in str(caught.value)
