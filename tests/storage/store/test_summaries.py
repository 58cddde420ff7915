"""``_metadata`` summaries for any store: written by the tool for plain Parquet and by ``write_dataset``, and the
reader telling once when a large store without one is planned from every footer."""

from __future__ import annotations

import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pytest

from petastorm import make_batch_reader, write_dataset
from petastorm.codecs import ScalarCodec
from petastorm.etl.petastorm_generate_metadata import generate_petastorm_metadata
from petastorm.unischema import Unischema, UnischemaField


def _plain_store(directory, files: int) -> str:
    os.makedirs(directory, exist_ok=True)
    for index in range(files):
        pq.write_table(pa.table({'x': np.arange(index * 10, (index + 1) * 10), 'y': np.full(10, index / 2)}),
                       os.path.join(directory, f'part-{index}.parquet'), row_group_size=5)
    return f'file://{directory}'


def _values(url: str) -> list[int]:
    with make_batch_reader(url, reader_pool_type='dummy') as reader:
        return sorted(int(v) for batch in reader for v in batch.x)


def test_the_tool_writes_the_summary_of_a_plain_store_without_a_schema_named(tmp_path):
    url = _plain_store(str(tmp_path / 'plain'), 4)
    generate_petastorm_metadata(None, url)
    summary = pq.read_metadata(str(tmp_path / 'plain' / '_metadata'))
    assert summary.num_row_groups == 8
    assert {summary.row_group(i).column(0).file_path for i in range(8)} == {f'part-{i}.parquet' for i in range(4)}
    assert not (tmp_path / 'plain' / '_common_metadata').exists()  # no schema of ours: the files' own stays
    assert _values(url) == list(range(40))
    assert pads.parquet_dataset(str(tmp_path / 'plain' / '_metadata')).count_rows() == 40


def test_the_tool_refuses_a_summary_of_files_whose_schemas_differ(tmp_path):
    from petastorm.errors import PetastormMetadataGenerationError

    url = _plain_store(str(tmp_path / 'mixed'), 2)
    pq.write_table(pa.table({'z': ['a']}), str(tmp_path / 'mixed' / 'part-9.parquet'))
    with pytest.raises(PetastormMetadataGenerationError, match='one schema'):
        generate_petastorm_metadata(None, url)


def test_write_dataset_writes_a_summary_when_asked(tmp_path):
    schema = Unischema('S', [UnischemaField('x', np.int64, (), ScalarCodec(pa.int64()), False)])
    url = f'file://{tmp_path / "written"}'
    result = write_dataset(url, schema, ({'x': i} for i in range(300)), row_group_size_mb=0.0005,
                           file_size_mb=0.001, write_summary=True)
    assert len(result.files) > 1
    summary = pq.read_metadata(str(tmp_path / 'written' / '_metadata'))
    assert summary.num_row_groups == sum(len(counts) for counts in result.row_groups.values())
    assert _values(url) == list(range(300))


def test_write_dataset_writes_the_summary_only_when_asked(tmp_path):
    schema = Unischema('S', [UnischemaField('x', np.int64, (), ScalarCodec(pa.int64()), False)])
    write_dataset(f'file://{tmp_path / "plain"}', schema, ({'x': i} for i in range(3)))
    assert not (tmp_path / 'plain' / '_metadata').exists()


def test_a_large_store_without_a_summary_is_told_once(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr('petastorm.store.plain.SUMMARY_HINT_FILES', 3)
    url = _plain_store(str(tmp_path / 'large'), 3)
    small = _plain_store(str(tmp_path / 'small'), 2)
    with caplog.at_level(logging.WARNING, logger='petastorm.store.plain'):
        _values(url)
        _values(url)
        _values(small)
    told = [r.getMessage() for r in caplog.records if 'no _metadata summary' in r.getMessage()]
    assert len(told) == 1
    assert 'petastorm-generate-metadata.py' in told[0]
    generate_petastorm_metadata(None, url)
    caplog.clear()
    monkeypatch.setattr('petastorm.store.plain._TOLD', set())
    with caplog.at_level(logging.WARNING, logger='petastorm.store.plain'):
        assert _values(url) == list(range(30))
    assert 'no _metadata summary' not in caplog.text  # planned from the summary


def test_the_tool_counts_one_file_in_the_singular(tmp_path, caplog):
    url = _plain_store(str(tmp_path / 'one'), 1)
    with caplog.at_level(logging.INFO, logger='petastorm.etl.petastorm_generate_metadata'):
        generate_petastorm_metadata(None, url)
    assert 'reading the footers of 1 file of' in caplog.text
    assert 'writing the _metadata summary of its 1 file' in caplog.text
    assert '1 files' not in caplog.text
