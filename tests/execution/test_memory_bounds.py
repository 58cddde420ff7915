"""Memory bounds: the pools' in-flight byte budget, decoding columns without a second copy, and a reader whose
decoded row groups in flight stay under its byte budget."""

import threading
import time
import tracemalloc

import numpy as np
import pyarrow as pa
import pytest

from petastorm import make_reader, write_dataset
from petastorm.codecs import ColumnBuilder, CompressedImageCodec, ScalarCodec
from petastorm.pools import default_max_bytes_in_flight, make_pool
from petastorm.pools.base import InFlightBudget, result_nbytes
from petastorm.unischema import Unischema, UnischemaField

MB = 1 << 20


def test_budget_counts_items_being_worked_on_twice():
    budget = InFlightBudget(max_in_flight=12, max_bytes_in_flight=4 * MB, workers_count=6)
    assert budget.limit == 2  # nothing seen yet: two items, whatever the number of workers
    budget.observe({'x': np.zeros(MB, dtype=np.uint8)})
    assert budget.limit == 2  # 2 items + 2 being read = 4 MB
    roomy = InFlightBudget(max_in_flight=12, max_bytes_in_flight=10 * MB, workers_count=3)
    roomy.observe({'x': np.zeros(MB, dtype=np.uint8)})
    assert roomy.limit == 7  # 7 results + 3 inputs of the items being read = 10 MB
    capped = InFlightBudget(max_in_flight=12, max_bytes_in_flight=1 << 40, workers_count=6)
    capped.observe({'x': np.zeros(MB, dtype=np.uint8)})
    assert capped.limit == 12
    huge = InFlightBudget(max_in_flight=12, max_bytes_in_flight=MB, workers_count=6)
    huge.observe({'x': np.zeros(3 * MB, dtype=np.uint8)})
    assert huge.limit == 1  # a result bigger than the budget still makes progress


def test_result_size_includes_arrays_held_in_object_columns():
    ragged = np.empty(100, dtype=object)
    for i in range(100):
        ragged[i] = np.zeros(1000 + i % 2, dtype=np.uint8)
    estimate = result_nbytes({'ragged': ragged, 'id': np.arange(100, dtype=np.int64), '.meta': {'num_rows': 100}})
    true_size = ragged.nbytes + sum(v.nbytes for v in ragged) + 800
    assert abs(estimate - true_size) < 0.01 * true_size
    assert result_nbytes({'names': np.array(['a' * 50, None, 'b' * 50], dtype=object)}) > 3 * 8 + 50


def test_default_budget_follows_the_cpus(monkeypatch):
    assert 256 * MB <= default_max_bytes_in_flight() <= 1024 * MB
    monkeypatch.setattr('os.sched_getaffinity', lambda pid: set(range(64)), raising=False)
    assert default_max_bytes_in_flight() == 1024 * MB
    monkeypatch.setattr('os.sched_getaffinity', lambda pid: {0}, raising=False)
    assert default_max_bytes_in_flight() == 256 * MB


class _Running:
    """Counts how many calls of the worker function run at the same time."""

    def __init__(self):
        self.lock = threading.Lock()
        self.now = 0
        self.most = 0


def _big_result(running, item):
    with running.lock:
        running.now += 1
        running.most = max(running.most, running.now)
    time.sleep(0.02)
    with running.lock:
        running.now -= 1
    return {'data': np.full(MB, item % 256, dtype=np.uint8)}


def test_thread_pool_runs_few_big_items_at_once():
    running = _Running()
    with make_pool('thread', 6, max_in_flight=12, max_bytes_in_flight=4 * MB) as pool:
        pool.start(_big_result, running)
        values = [int(result['data'][0]) for result in pool.imap(range(30))]
    assert values == [i % 256 for i in range(30)]
    # Six workers, but 1 MB results in a 4 MB budget: two items in flight (each also holds its input while read).
    assert running.most <= 2


def test_image_column_is_decoded_without_a_second_copy():
    codec = CompressedImageCodec('png')
    field = UnischemaField('image', np.uint8, (64, 96, 3), codec, False)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (64, 96, 3), dtype=np.uint8) for _ in range(32)]
    column = pa.array([codec.encode(field, image) for image in images], type=pa.binary())
    column_bytes = sum(image.nbytes for image in images)
    tracemalloc.start()
    try:
        decoded = codec.decode_column(field, column)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(decoded, np.stack(images))
    # The decoded column plus a couple of images in passing; a list of images stacked afterwards needs 2x.
    assert peak < 1.3 * column_bytes


def test_column_builder_keeps_odd_values_as_objects():
    builder = ColumnBuilder(4)
    builder.add(np.arange(3))
    builder.add(np.arange(3) + 10, lambda value, out: np.negative(value, out=out))
    builder.add(None)
    builder.add(np.arange(2))
    column = builder.result()
    assert column.dtype == object
    assert [None if v is None else v.tolist() for v in column] == [[0, 1, 2], [-10, -11, -12], None, [0, 1]]
    zero_d = ColumnBuilder(2)
    zero_d.add(np.array(5, dtype=np.int8))
    zero_d.add(np.array(6, dtype=np.int8))
    assert zero_d.result().tolist() == [5, 6]
    partial = ColumnBuilder(2)
    partial.add(np.arange(2))
    with pytest.raises(ValueError, match='expected 2 values, got 1'):
        partial.result()



def test_column_builder_releases_the_column_array_when_values_turn_ragged():
    builder = ColumnBuilder(1000)
    for i in range(999):
        builder.add(np.full(64, i, dtype=np.float64))
    builder.add(np.arange(3.0))  # another shape: the column becomes an object array
    column = builder.result()
    assert column.dtype == object
    # Earlier rows own their data: none keeps the 1000-row array (sized for every row) alive.
    assert all(value.base is None and value.shape == (64,) for value in column[:999])
    assert column[5].tolist() == [5.0] * 64
    assert column[999].tolist() == [0.0, 1.0, 2.0]


ImageSchema = Unischema('ImageSchema', [
    UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
    UnischemaField('image', np.uint8, (128, 1024), CompressedImageCodec('png'), False),
])


def test_reader_keeps_decoded_row_groups_in_flight_under_its_budget(tmp_path, monkeypatch):
    url = 'file://' + str(tmp_path / 'images')
    rng = np.random.default_rng(0)
    # 64 noise images of 128 kB (slow to decode, so that workers overlap) in row groups of about 1 MB decoded.
    write_dataset(url, ImageSchema, ({'id': i, 'image': rng.integers(0, 255, (128, 1024), dtype=np.uint8)}
                                     for i in range(64)), row_group_size_mb=1.05)
    monkeypatch.setattr('petastorm.reading.passes.default_max_bytes_in_flight', lambda: 4 * MB)
    tracemalloc.start()
    try:
        seen = []
        with make_reader(url, workers_count=10, shuffle_row_groups=False) as reader:
            for batch in reader.column_batches():
                seen.extend(batch.columns['id'].tolist())
                del batch
                time.sleep(0.01)  # a slow consumer: the workers get ahead as far as the budget lets them
            diagnostics = reader.diagnostics
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen == list(range(64))
    row_group = diagnostics['mean_result_bytes']
    assert 0.7 * MB < row_group < 1.5 * MB
    # The budget, plus the row group being consumed and the one being handed over. Ten workers decoding row
    # groups at once (each into a list of images, then stacked) would hold several times more.
    assert peak < 4 * MB + 2 * row_group
