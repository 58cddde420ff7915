"""Spark DataFrames as PyTorch and TensorFlow training data (see :mod:`petastorm.spark.spark_dataset_converter`).

Importing this package does not import pyspark, torch or tensorflow; the functions do when called.
"""

from __future__ import annotations

from petastorm.spark.spark_dataset_converter import SparkDatasetConverter, make_spark_converter

__all__ = ['SparkDatasetConverter', 'make_spark_converter']
