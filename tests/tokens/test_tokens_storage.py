"""The token loader and the document source read where the readers read: a Delta table's version, an Iceberg
table's snapshot, and S3 (moto's server on loopback).

Token ids say where they come from (``support.token_corpus``), so each test checks every token once.
"""

import collections
import pickle

import pyarrow as pa
import pytest

from support.s3_loopback import BUCKET, MotoServer
from support.token_corpus import batch_tokens, document, expected_tokens, lognormal_lengths, write_corpus

pytest.importorskip('grain')
from petastorm.tokens import make_document_source, make_token_dataset  # noqa: E402

LENGTHS = lognormal_lengths(80, median=12, seed=7, longest=50)


def _tokens(url, **kwargs):
    with make_token_dataset(url, seq_len=16, batch_size=4, workers_count=1, **kwargs) as dataset:
        return collections.Counter(t for batch in dataset for t in batch_tokens(batch))


def test_a_delta_table_at_a_pinned_version(tmp_path):
    deltalake = pytest.importorskip('deltalake')
    table = str(tmp_path / 'delta')

    def rows(first, lengths):
        return pa.table({'input_ids': pa.array([document(first + i, int(n)) for i, n in enumerate(lengths)],
                                               pa.list_(pa.int32()))})

    deltalake.write_deltalake(table, rows(0, LENGTHS[:50]))
    deltalake.write_deltalake(table, rows(50, LENGTHS[50:]), mode='append')
    assert _tokens(f'file://{table}') == expected_tokens(LENGTHS)
    assert _tokens(f'file://{table}', reader_options={'table_version': 0}) == expected_tokens(LENGTHS[:50])
    pinned = make_document_source(f'file://{table}', reader_options={'table_version': 0})
    assert len(pinned) == 50
    assert collections.Counter(t for i in range(50) for t in pinned[i]['input_ids'].tolist()) == \
        expected_tokens(LENGTHS[:50])


def test_an_iceberg_table_and_a_pinned_snapshot(tmp_path):
    pytest.importorskip('pyiceberg')
    from pyiceberg.catalog.sql import SqlCatalog

    (tmp_path / 'warehouse').mkdir()
    catalog = SqlCatalog('tokens', uri=f'sqlite:///{tmp_path}/catalog.db', warehouse=f'file://{tmp_path}/warehouse')
    catalog.create_namespace('ns')
    schema = pa.schema([pa.field('input_ids', pa.large_list(pa.int64()))])

    def rows(first, lengths):
        return pa.table({'input_ids': [document(first + i, int(n)).astype('int64') for i, n in enumerate(lengths)]},
                        schema=schema)

    table = catalog.create_table('ns.docs', schema=schema)
    table.append(rows(0, LENGTHS[:30]))
    first = table.current_snapshot().snapshot_id
    table.append(rows(30, LENGTHS[30:]))
    assert _tokens(table) == expected_tokens(LENGTHS)
    assert _tokens(table, reader_options={'table_version': first}) == expected_tokens(LENGTHS[:30])
    pinned = make_document_source(table, reader_options={'table_version': first})
    assert sorted(pinned[i]['input_ids'].tolist()[0] for i in range(len(pinned))) == \
        [document(i, 1).tolist()[0] for i in range(30)]


def test_a_store_on_s3(tmp_path):
    s3fs = pytest.importorskip('s3fs')
    pytest.importorskip('moto')
    local = write_corpus(tmp_path / 'docs.parquet', LENGTHS, row_group_size=20)
    with MotoServer() as server:
        options = server.storage_options()
        fs = s3fs.S3FileSystem(**options, skip_instance_cache=True)
        fs.mkdir(BUCKET)
        fs.put(local[len('file://'):], f'{BUCKET}/tokens/docs.parquet')
        url = f's3://{BUCKET}/tokens'
        assert _tokens(url, storage_options=options) == expected_tokens(LENGTHS)
        ranks = [_tokens(url, storage_options=options, cur_shard=rank, shard_count=2) for rank in range(2)]
        source = pickle.loads(pickle.dumps(make_document_source(url, storage_options=options)))
        records = [source[i]['input_ids'].tolist() for i in range(len(source))]
    assert ranks[0] + ranks[1] == expected_tokens(LENGTHS)
    assert records == [document(i, int(n)).tolist() for i, n in enumerate(LENGTHS)]
