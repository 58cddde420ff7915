"""Type tables of the model layer: how other systems' types become the fields and columns of a Unischema.

* :mod:`~petastorm.typemaps.scalars`: native (codec-less) columns: numpy types to Arrow types and back, values
  checked for writing, Arrow columns turned into numpy columns for reading.
* :mod:`~petastorm.typemaps.spark`: Spark SQL types to Arrow types and back, without importing pyspark.
* :mod:`~petastorm.typemaps.structs`: Arrow struct types as trees: the dotted paths of their leaves, pruning.

:mod:`petastorm.unischema` and :mod:`petastorm.codecs` use them; users rarely import them. They import neither (the
codecs sit above the type tables): what a Hugging Face feature makes of a column picks a codec, so it is the codecs'
(``petastorm.codecs._inference``).
"""

__all__: list[str] = []
