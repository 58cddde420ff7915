"""The exceptions petastorm raises.

Every exception derives from :class:`PetastormError` and, where a caller would naturally catch a builtin,
also from that builtin (a bad schema is a ``ValueError``, a missing file an ``OSError``), so code written
for the original Petastorm keeps catching what it caught before.
"""

from __future__ import annotations

__all__ = [
    'CodecError', 'CorruptDataError', 'CorruptFooterError', 'DataFileChangedError', 'DatasetWriteError',
    'DecodeFieldError', 'MissingDataFilesError', 'MissingDependencyError', 'NoDataAvailableError',
    'NoMatchingFieldsError', 'PetastormError', 'PetastormMetadataError', 'PetastormMetadataGenerationError',
    'SchemaError', 'StorageCredentialsError', 'StorageError', 'StorageNotFoundError', 'StorageOptionsError',
    'StoragePermissionError', 'TableVersionError', 'UnsupportedTableFeatureError',
]


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


class StorageOptionsError(PetastormError, ValueError, TypeError):
    """A ``storage_options`` key that no client of the URL takes, or one setting given twice with different values.

    Raised before any request; the message names the key, where it came from (``storage_options`` or a dict in it),
    the closest accepted name and the accepted names. A ``ValueError`` (a bad argument) and a ``TypeError`` (what
    the client's unexpected keyword argument raised before), so either ``except`` catches it.
    """


class TableVersionError(PetastormMetadataError, ValueError):
    """A table version, snapshot, tag or timestamp that the table does not have (the message says which it has)."""


class UnsupportedTableFeatureError(PetastormMetadataError, NotImplementedError):
    """The table uses a feature this reader does not implement (named in the message); it is never read wrongly."""


class CorruptFooterError(CorruptDataError, PetastormMetadataError):
    """A data file's Parquet footer, read while planning, is unreadable: the file is truncated, corrupt or not Parquet.

    The message names the file's URL. It is both a :class:`CorruptDataError` (what a damaged file raises when read)
    and a :class:`PetastormMetadataError` (what planning raises), so either ``except`` catches it.
    """


class MissingDataFilesError(StorageNotFoundError, PetastormMetadataError):
    """The dataset's metadata names data files that are not in the store (deleted, or never uploaded).

    Raised while planning, before any row is read: the rows of those files would otherwise be silently missing
    from every epoch. The message names the metadata file and the missing files; ``urls`` holds every one.
    """

    def __init__(self, message: str, urls: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.urls = tuple(urls)


class DataFileChangedError(StorageError):
    """A data file changed (its size, or its ETag or generation where the storage gives one) after its read was planned.

    The row groups planned from the old file may not be those of the new one, so nothing more is read from it;
    the message names the file's URL. Make a new reader to read the new contents.
    """
