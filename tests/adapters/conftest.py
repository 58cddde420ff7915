"""Fixtures of the adapter tests."""

from __future__ import annotations

import pytest

from support.spark_converters import CONF


@pytest.fixture
def cache_parent(spark, tmp_path):
    """The converter's parent cache directory, set in the session conf for one test."""
    parent = tmp_path / 'converter_cache'
    spark.conf.set(CONF, f'file://{parent}')
    yield parent
    spark.conf.unset(CONF)


@pytest.fixture(scope='module')
def typed_url(tmp_path_factory):
    """A store of every numpy type a field may have (see :mod:`support.tf_datasets`)."""
    from support.tf_datasets import write_typed_store

    return write_typed_store(tmp_path_factory.mktemp('tf'))


@pytest.fixture(scope='module')
def seq_url(tmp_path_factory):
    """A store of 30 sequential rows for NGram windows (see :mod:`support.tf_datasets`)."""
    from support.tf_datasets import write_seq_store

    return write_seq_store(tmp_path_factory.mktemp('tf'))
