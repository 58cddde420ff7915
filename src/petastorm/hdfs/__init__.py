"""Petastorm's ``petastorm.hdfs`` package path. See :mod:`petastorm.fs.hadoop`."""

__all__: list[str] = []
