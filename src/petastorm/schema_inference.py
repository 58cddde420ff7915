"""Inferring a Unischema from the Arrow schema of a plain Parquet store (re-exports).

The inference is :meth:`petastorm.unischema.Unischema.from_arrow_schema` and
:func:`petastorm.unischema.infer_unischema`; the Arrow-to-numpy type table is :mod:`petastorm.scalars`'.
"""

from petastorm.scalars import numpy_type_of_arrow
from petastorm.unischema import infer_unischema

__all__ = ['infer_unischema', 'numpy_type_of_arrow']
