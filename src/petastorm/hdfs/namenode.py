"""Petastorm's ``petastorm.hdfs.namenode`` module path. Re-exports only; see :mod:`petastorm.fs.hadoop`."""

from __future__ import annotations

from petastorm.fs.hadoop import (
    HAHdfsClient,
    HdfsConnectError,
    HdfsConnector,
    HdfsNamenodeResolver,
    MaxFailoversExceeded,
    failover_all_class_methods,
    namenode_failover,
)

__all__ = ['HAHdfsClient', 'HdfsConnectError', 'HdfsConnector', 'HdfsNamenodeResolver', 'MaxFailoversExceeded',
           'failover_all_class_methods', 'namenode_failover']
