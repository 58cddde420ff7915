"""Petastorm's ``petastorm.hdfs`` package path. See :mod:`petastorm.fs.hadoop`."""
