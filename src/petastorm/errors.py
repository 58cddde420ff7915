"""The exceptions petastorm raises.

Every exception derives from :class:`PetastormError` and, where a caller would naturally catch a builtin,
also from that builtin (a bad schema is a ``ValueError``, a missing file an ``OSError``), so code written
for the original Petastorm keeps catching what it caught before.
"""

from __future__ import annotations


class PetastormError(Exception):
    """Root of every exception defined by petastorm."""


class NoDataAvailableError(PetastormError):
    """The requested shard or selection contains no rows at all."""


class SchemaError(PetastormError, ValueError):
    """A Unischema, a field definition or a value does not match what the schema says."""


class NoMatchingFieldsError(PetastormError, RuntimeError, ValueError):
    """``schema_fields`` selects no field of the dataset: a ``RuntimeError`` (Petastorm's type) and a ``ValueError``."""


class CodecError(PetastormError, ValueError):
    """A codec could not encode or decode a value (the message names the field and what was expected)."""


class DecodeFieldError(PetastormError, RuntimeError):
    """Decoding one field of a row failed; the original error is chained as ``__cause__``."""


class PetastormMetadataError(PetastormError):
    """The dataset's metadata is missing, unreadable, refused or from an unsupported version."""


class PetastormMetadataGenerationError(PetastormError):
    """Metadata could not be written for a dataset (for instance the write produced no files)."""


class CorruptDataError(PetastormError, OSError):
    """A Parquet data file of the dataset is truncated, corrupt or not Parquet at all.

    The message names the file and the row group being read; the error from the Parquet library is chained as
    ``__cause__``.
    """


class DatasetWriteError(PetastormError, OSError):
    """Writing a dataset failed; whatever had been written was removed."""


class MissingDependencyError(PetastormError, ImportError):
    """An optional dependency is needed for this feature; the message names the pip extra to install."""


class StorageError(PetastormError, OSError):
    """A storage operation on a dataset URL failed; the message names the URL and never shows credentials."""


class StorageNotFoundError(StorageError, FileNotFoundError):
    """The URL names nothing on its storage."""


class StorageCredentialsError(StorageError, PermissionError):
    """The storage refused the credentials (invalid, expired or missing) used for a URL."""


class StoragePermissionError(StorageError, PermissionError):
    """The storage denied an operation on a URL to the credentials in use."""


class TableVersionError(PetastormMetadataError, ValueError):
    """A table version, snapshot, tag or timestamp that the table does not have (the message says which it has)."""


class UnsupportedTableFeatureError(PetastormMetadataError, NotImplementedError):
    """The table uses a feature this reader does not implement (named in the message); it is never read wrongly."""
