"""Type tables of the model layer: how other systems' types become the fields and columns of a Unischema.

* :mod:`~petastorm.typemaps.scalars`: native (codec-less) columns: numpy types to Arrow types and back, values
  checked for writing, Arrow columns turned into numpy columns for reading.
* :mod:`~petastorm.typemaps.spark`: Spark SQL types to Arrow types and back, without importing pyspark.
* :mod:`~petastorm.typemaps.hf_features`: the ``huggingface`` features stored by ``datasets`` in Parquet files.

:mod:`petastorm.unischema` and :mod:`petastorm.codecs` use them; users rarely import them.
"""

__all__: list[str] = []
