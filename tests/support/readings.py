"""A small dataset of sensor readings (an id, a sensor number, a 3-vector) shared by the progress and repr tests."""

import numpy as np
import pyarrow as pa

from petastorm import write_dataset
from petastorm.codecs import NdarrayCodec, ScalarCodec
from petastorm.unischema import Unischema, UnischemaField

Readings = Unischema('Readings', [UnischemaField('id', np.int64, (), ScalarCodec(pa.int64()), False),
                                  UnischemaField('sensor', np.int32, (), ScalarCodec(pa.int32()), False),
                                  UnischemaField('values', np.float32, (3,), NdarrayCodec(), False)])
ROWS = 300


def readings_rows(count=ROWS):
    return [{'id': i, 'sensor': i % 5, 'values': np.full(3, i, np.float32)} for i in range(count)]


def write_readings(directory):
    """Write the readings in small row groups under ``directory``; return the dataset URL."""
    url = directory.joinpath('ds').as_uri()
    write_dataset(url, Readings, readings_rows(), row_group_size_mb=0.002, progress=False)
    return url
