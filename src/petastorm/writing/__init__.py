"""Writing Parquet datasets: rows encoded to Arrow, files rolled, the write staged and committed as a whole.

:func:`petastorm.write_dataset` (``petastorm.writer``) is the entry point; these are its steps, public for writers
that spread them over a cluster (``petastorm.ray``'s datasink) and for Delta writes (``petastorm.tables``).
"""

from petastorm.writing.encode import encode_rows
from petastorm.writing.files import FileRoller
from petastorm.writing.staged import StagedWrite

__all__ = ['FileRoller', 'StagedWrite', 'encode_rows']
