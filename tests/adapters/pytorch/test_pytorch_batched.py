"""petastorm.pytorch's BatchedDataLoader and InMemBatchedDataLoader, the compiled shuffle, and the MNIST example."""

import importlib.util
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip('torch')

from petastorm import TransformSpec, make_reader  # noqa: E402
from petastorm.predicates import in_lambda  # noqa: E402
from petastorm.pytorch import (  # noqa: E402
    BatchedDataLoader,
    DataLoader,
    InMemBatchedDataLoader,
)
from petastorm.shuffle import compiled_shuffle_in_use  # noqa: E402
from support.torch_loaders import (  # noqa: E402
    NUMERIC,
    ROWS,
    assert_same_batch,
    dummy_batch_reader,
    dummy_reader,
    ids_of,
    write_plain_store,
    write_torch_store,
)
from support.torch_rows import JAGGED_NESTED  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings('ignore:Please use make_reader:UserWarning')]

@pytest.fixture(scope='module')
def url(tmp_path_factory):
    return write_torch_store(tmp_path_factory.mktemp('torch'))


@pytest.fixture(scope='module')
def plain_url(tmp_path_factory):
    return write_plain_store(tmp_path_factory.mktemp('plain'))


# -- BatchedDataLoader --------------------------------------------------------------------------------------------

def test_batched_loader_batch_reader(plain_url):
    reader = dummy_batch_reader(plain_url, schema_fields=['id', 'x', 'u'])
    with BatchedDataLoader(reader, batch_size=64) as loader:
        batches = list(loader)
    assert [len(b['id']) for b in batches] == [64] * 4 + [44]
    assert ids_of(batches) == list(range(300))
    assert batches[0]['x'].dtype == torch.float32
    assert batches[0]['u'].dtype == torch.int64
    assert torch.equal(batches[1]['x'], torch.arange(64, 128, dtype=torch.float32) / 2)


def test_batched_loader_shuffles_reproducibly(plain_url):
    def run(seed, **kwargs):
        reader = dummy_batch_reader(plain_url, schema_fields=['id', 'x'], seed=seed)
        with BatchedDataLoader(reader, batch_size=32, shuffling_queue_capacity=100, **kwargs) as loader:
            batches = list(loader)
        for batch in batches:
            assert torch.equal(batch['x'], batch['id'].float() / 2)
        return ids_of(batches)

    first = run(1)
    assert sorted(first) == list(range(300))
    assert first != list(range(300))
    assert first == run(1)
    assert first != run(2)
    assert run(1, transform_fn=torch.as_tensor) == first


def test_batched_loader_make_reader_and_transform_fn(url):
    with BatchedDataLoader(dummy_reader(url, schema_fields=NUMERIC), batch_size=20,
                           transform_fn=lambda column: torch.as_tensor(np.array(column)) * 2) as loader:
        batches = list(loader)
    assert ids_of(batches) == [2 * i for i in range(ROWS)]
    assert batches[0]['matrix'].shape == (20, 2, 3)
    assert batches[0]['flag'].dtype == torch.uint8


def test_batched_loader_refuses_strings_and_decimals(url):
    reader = dummy_reader(url)
    with pytest.raises(TypeError, match=r'string or Decimal fields: name \(str_\), price \(Decimal\)'):
        BatchedDataLoader(reader, batch_size=4)
    assert reader.stopped
    if not JAGGED_NESTED:
        return
    with BatchedDataLoader(dummy_reader(url, schema_fields=['id', 'seq']), batch_size=8,
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
        reader = dummy_batch_reader(plain_url, schema_fields=['id', 'label'],
                               transform_spec=TransformSpec(_label_to_int_frame))
    kwargs = {'num_epochs': 1, 'rows_capacity': 300} if loader_cls is InMemBatchedDataLoader else {}
    with loader_cls(reader, batch_size=100, **kwargs) as loader:
        batches = list(loader)
    ids = torch.cat([b['id'] for b in batches])
    labels = torch.cat([b['label'] for b in batches])
    assert labels.dtype == torch.int64
    assert torch.equal(labels, ids % 7)
    # A transform that leaves the strings as they are is still refused, naming the field, at the first batch.
    reader = dummy_batch_reader(plain_url, schema_fields=['id', 'label'], transform_spec=TransformSpec(lambda f: f))
    with pytest.raises(TypeError, match="field 'label'"), loader_cls(reader, batch_size=100, **kwargs) as loader:
        list(loader)


def _shuffled_loaders(url, plain_url):
    """Each loader kind with shuffling, seeded: what must give the same batches with and without the kernel."""
    return {
        'DataLoader': lambda: DataLoader(dummy_reader(url, schema_fields=['id', 'matrix', 'name'], seed=5),
                                         batch_size=7, shuffling_queue_capacity=20),
        'BatchedDataLoader': lambda: BatchedDataLoader(dummy_reader(url, schema_fields=NUMERIC, seed=5), batch_size=7,
                                                       shuffling_queue_capacity=20),
        'BatchedDataLoader batch reader': lambda: BatchedDataLoader(
            dummy_batch_reader(plain_url, schema_fields=['id', 'x', 'u'], seed=5), batch_size=32,
            shuffling_queue_capacity=100),
        'InMemBatchedDataLoader': lambda: InMemBatchedDataLoader(
            dummy_batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=32, num_epochs=2, seed=5,
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
        assert_same_batch(a, b)
    ids = ids_of(with_kernel)
    assert ids != sorted(ids)


# -- InMemBatchedDataLoader ---------------------------------------------------------------------------------------

def test_inmem_loader_epochs_and_shuffling(plain_url):
    reader = dummy_batch_reader(plain_url, schema_fields=['id', 'x'])
    loader = InMemBatchedDataLoader(reader, batch_size=64, num_epochs=3, seed=5, rows_capacity=1000, shuffle=True)
    assert reader.stopped
    batches = list(loader)
    assert len(batches) == 3 * 5 == len(loader)
    epochs = [ids_of(batches[i * 5:(i + 1) * 5]) for i in range(3)]
    for epoch in epochs:
        assert sorted(epoch) == list(range(300))
        assert epoch != list(range(300))
    assert epochs[0] != epochs[1]
    for batch in batches:
        assert torch.equal(batch['x'], batch['id'].float() / 2)
    # A finished iteration: another one serves the next 3 epochs (seeded 5 + 3, 5 + 4, 5 + 5). Before, a second
    # iteration raised even after the first ended, which trainers that iterate once per epoch cannot live with.
    more = list(loader)
    assert [sorted(ids_of(more[i * 5:(i + 1) * 5])) for i in range(3)] == [list(range(300))] * 3
    assert ids_of(more[:5]) not in epochs
    live = iter(loader)
    next(live)
    with pytest.raises(RuntimeError, match="InMemBatchedDataLoader couldn't be used multiple times"):
        next(iter(loader))
    again = InMemBatchedDataLoader(dummy_batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=64,
                                   num_epochs=1, seed=5, rows_capacity=1000, shuffle=True)
    assert ids_of(again) == epochs[0]


def test_inmem_loader_unshuffled_batches_are_copies_and_capacity_truncates(url):
    with pytest.warns(UserWarning, match='kept the first 30 rows'):
        loader = InMemBatchedDataLoader(dummy_reader(url, schema_fields=['id', 'matrix']), batch_size=30,
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
    loader = InMemBatchedDataLoader(dummy_batch_reader(plain_url, schema_fields=['id', 'x']), batch_size=64,
                                    num_epochs=2, seed=7, rows_capacity=1000, shuffle=shuffle)
    batches = list(loader)
    assert [len(b['id']) for b in batches] == [64, 64, 64, 64, 44] * 2
    for epoch in range(2):
        expected = torch.randperm(300, generator=torch.Generator().manual_seed(7 + epoch)).tolist() if shuffle \
            else list(range(300))
        assert ids_of(batches[epoch * 5:(epoch + 1) * 5]) == expected
    for batch in batches:
        assert torch.equal(batch['x'], batch['id'].float() / 2)
        assert batch['id'].is_contiguous()
        assert batch['x'].is_contiguous()


@pytest.mark.parametrize('nested', [False, True])
def test_inmem_state_resumes_the_served_epochs_exactly(plain_url, url, nested):
    def loader(**kwargs):
        reader = dummy_reader(url, schema_fields=['id', 'seq']) if nested else \
            dummy_batch_reader(plain_url, schema_fields=['id', 'x'])
        kwargs = {'batch_size': 8 if nested else 64, 'num_epochs': 2, 'seed': 5, 'rows_capacity': 1000,
                  'shuffle': True, 'variable_length': 'jagged', **kwargs}
        return InMemBatchedDataLoader(reader, **kwargs)

    whole = loader()
    per_pass = len(whole)
    expected = [ids_of([b]) for b in list(whole) + list(whole)]  # two iterations: epochs 0 to 3
    first = loader()
    batches = iter(first)
    for _ in range(per_pass + 3):  # the first iteration, then 3 batches of the second
        if _ == per_pass:
            batches = iter(first)
        next(batches)
    state = first.state_dict()
    assert state['iteration'] == 1
    assert state['batches_delivered'] == 3
    resumed = loader()
    resumed.load_state_dict(state)
    assert [ids_of([b]) for b in resumed] == expected[per_pass + 3:], 'exactly the batches left'
    assert resumed.state_dict()['iteration'] == 2
    assert resumed.state_dict()['batches_delivered'] == 0
    with pytest.raises(ValueError, match=r'seed=5 \(this loader: 6\)'):
        loader(seed=6).load_state_dict(state)
    told = loader()
    told.set_epoch(1)  # what trainers call at an epoch's start: iteration 1 is epochs 2 and 3
    assert [ids_of([b]) for b in told] == expected[per_pass:]


def test_inmem_unknown_row_count_grows_and_tensor_columns(url):
    # A predicate hides the row count; a transform returning bfloat16 (no numpy dtype) keeps tensor columns.
    reader = dummy_reader(url, schema_fields=['id', 'matrix'], predicate=in_lambda(['id'], lambda i: i % 5 != 0))
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
    path = pathlib.Path(__file__).parents[3] / 'examples' / 'mnist' / f'{name}.py'
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

    script = pathlib.Path(__file__).parents[3] / 'benchmarks' / 'torch_bench.py'
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
