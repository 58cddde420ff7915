"""petastorm.pytorch: the three loaders over both reader kinds, collation, shuffling, iteration rules, the example."""

import decimal
import math
import threading

import numpy as np
import pyarrow as pa
import pytest

torch = pytest.importorskip('torch')

from petastorm import TransformSpec, make_reader, write_dataset  # noqa: E402
from petastorm.codecs import ScalarCodec  # noqa: E402
from petastorm.predicates import in_lambda  # noqa: E402
from petastorm.pytorch import (  # noqa: E402
    BatchedDataLoader,
    DataLoader,
    InMemBatchedDataLoader,
    _sanitize_pytorch_types,
    decimal_friendly_collate,
)
from petastorm.shuffle import Batcher, ShufflingBuffer  # noqa: E402
from petastorm.unischema import Unischema, UnischemaField  # noqa: E402
from support.torch_loaders import (  # noqa: E402
    NUMERIC,
    ROWS,
    Schema,
    assert_same_batch,
    dummy_batch_reader,
    dummy_reader,
    ids_of,
    write_plain_store,
    write_torch_store,
)

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]

@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_torch_store(tmp_path_factory.mktemp('torch'))


@pytest.fixture(scope='module')
def plain_url(tmp_path_factory):
    return write_plain_store(tmp_path_factory.mktemp('plain'))


# -- DataLoader ---------------------------------------------------------------------------------------------------

def test_dataloader_rows_values_dtypes_and_shapes(url):
    with DataLoader(dummy_reader(url), batch_size=8) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [8] * 6 + [2]
    assert ids_of(batches) == list(range(ROWS))
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


def test_torchs_own_dataloader_over_a_reader_says_what_to_use(url):
    with dummy_reader(url, schema_fields=['id']) as reader, \
            pytest.raises(TypeError, match=r'cannot be indexed \(reader\[0\]\); torch.utils.data.DataLoader\(reader\) '
                                           r'needs a map-style dataset: use petastorm.pytorch.DataLoader'):
        next(iter(torch.utils.data.DataLoader(reader, batch_size=4)))


def test_columnar_batches_equal_collating_the_rows(url):
    """The fast path gives what decimal_friendly_collate gives on the reader's rows, batch for batch."""
    with DataLoader(dummy_reader(url), batch_size=7) as fast:
        fast_batches = list(fast)
    with DataLoader(dummy_reader(url), batch_size=7, collate_fn=lambda rows: decimal_friendly_collate(rows)) as slow:
        slow_batches = list(slow)
    with dummy_reader(url) as reader:
        rows = [row._asdict() for row in reader]
    for row in rows:
        numeric = {k: v for k, v in row.items() if k not in ('name', 'price')}
        _sanitize_pytorch_types(numeric)  # uint16 -> int32 as the loaders do (torch before 2.3 has no uint16)
        row.update(numeric)
    reference = [decimal_friendly_collate(rows[i:i + 7]) for i in range(0, ROWS, 7)]
    assert len(fast_batches) == len(slow_batches) == len(reference) == math.ceil(ROWS / 7)
    for a, b in zip(fast_batches, slow_batches, strict=True):
        assert_same_batch(a, b)
    for a, b in zip(fast_batches, reference, strict=True):
        for key in ('id', 'weight', 'matrix', 'name', 'price'):
            assert_same_batch(a[key], b[key])


def test_dataloader_batch_reader_and_strings(plain_url):
    with DataLoader(dummy_batch_reader(plain_url), batch_size=64) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [64] * 4 + [44]
    assert ids_of(batches) == list(range(300))
    assert batches[0]['x'].dtype == torch.float32
    assert batches[0]['id'].dtype == torch.int64
    assert batches[0]['u'].dtype == torch.int64  # uint32 -> int64
    assert batches[0]['label'][:3] == ['l0', 'l1', 'l2']


def test_custom_collate_receives_row_dicts(url):
    seen = []

    def collate(rows):
        seen.append(rows)
        return len(rows)

    with DataLoader(dummy_reader(url, schema_fields=['id', 'small']), batch_size=20, collate_fn=collate) as loader:
        assert list(loader) == [20, 20, 10]
    assert set(seen[0][0]) == {'id', 'small'}
    assert seen[0][0]['small'].dtype == np.int32


def test_tuple_transform_gives_positional_batches(url):
    def to_tuple(row):
        return torch.as_tensor(row['matrix']).unsqueeze(0), row['id']

    spec = TransformSpec(to_tuple, removed_fields=[n for n in Schema.fields if n not in ('id', 'matrix')])
    with DataLoader(dummy_reader(url, transform_spec=spec), batch_size=16) as loader:
        batches = list(loader)
    images, ids = batches[0]
    assert isinstance(batches[0], list)
    assert images.shape == (16, 1, 2, 3)
    assert images.dtype == torch.float32
    assert ids.dtype == torch.int32
    assert ids.tolist() == list(range(16))
    with BatchedDataLoader(dummy_reader(url, transform_spec=spec), batch_size=16) as loader:
        images, ids = next(iter(loader))
    assert images.shape == (16, 1, 2, 3)
    assert ids.tolist() == list(range(16))
    loader = InMemBatchedDataLoader(dummy_reader(url, transform_spec=spec), batch_size=25, rows_capacity=100)
    assert [len(ids) for _, ids in loader] == [25, 25]


def test_variable_length_pad_policy(url):
    with DataLoader(dummy_reader(url, schema_fields=['id', 'seq']), batch_size=5, variable_length='pad',
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
        DataLoader(dummy_reader(url), variable_length='stack')


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
    with DataLoader(dummy_reader(target), batch_size=6) as loader, \
            pytest.raises(TypeError, match='Pytorch does not support nullable fields. Found None in maybe'):
        next(iter(loader))


def test_shuffling_buffer_keeps_rows_and_is_reproducible(url):
    def run(seed):
        reader = dummy_reader(url, schema_fields=['id', 'matrix', 'name'], seed=seed)
        with DataLoader(reader, batch_size=10, shuffling_queue_capacity=20) as loader:
            batches = list(loader)
        for batch in batches:
            assert batch['matrix'][:, 0, 0].long().tolist() == batch['id'].tolist()
            assert batch['name'] == [f'row{i}' for i in batch['id'].tolist()]
        return ids_of(batches)

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

    with dummy_reader(url, schema_fields=['id', 'matrix']) as reader, pytest.warns(UserWarning, match='rows_capacity'):
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

    with DataLoader(dummy_reader(url, schema_fields=['id']), batch_size=8, collate_fn=failing) as loader:
        with pytest.raises(ValueError, match='collate failed'):
            list(loader)
        with pytest.raises(RuntimeError, match='Cannot start a new iteration because last time iteration failed'):
            next(iter(loader))


def test_len_and_isinstance(url):
    reader = dummy_reader(url, num_epochs=3)
    assert reader.num_rows_per_pass == 3 * ROWS
    with DataLoader(reader, batch_size=8) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert len(loader) == math.ceil(3 * ROWS / 8) == len(list(loader))
        assert loader.batch_size == 8
    with DataLoader(dummy_reader(url, num_epochs=None), batch_size=8) as loader, pytest.raises(TypeError):
        len(loader)
    predicate = in_lambda(['id'], lambda i: i < 10)
    with DataLoader(dummy_reader(url, predicate=predicate), batch_size=8) as loader, pytest.raises(TypeError):
        len(loader)
    with BatchedDataLoader(dummy_reader(url, schema_fields=NUMERIC), batch_size=16) as loader:
        assert isinstance(loader, torch.utils.data.DataLoader)
        assert len(loader) == 4
    loader = InMemBatchedDataLoader(dummy_reader(url, schema_fields=['id']), batch_size=16, num_epochs=2,
                                    rows_capacity=99)
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
    assert ids_of(batches) == list(range(ROWS))
    batches[0]['matrix'] += 1  # batches own writable memory


def test_reader_without_column_batches_weighted_sampling(url):
    from petastorm.weighted_sampling_reader import WeightedSamplingReader

    readers = [dummy_reader(url, schema_fields=['id', 'matrix'], seed=s) for s in (1, 2)]
    with DataLoader(WeightedSamplingReader(readers, [0.5, 0.5], seed=3), batch_size=10) as loader:
        batches = list(loader)
    ids = ids_of(batches)
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
        loader = DataLoader(dummy_reader(url, schema_fields=['id']), batch_size=8, pin_memory=True)
    with loader:
        assert len(list(loader)) == 7
