"""Petastorm datasets on a Ray cluster: read them into Ray Data, write Ray Datasets as Petastorm datasets.

Example::

    import ray
    from petastorm.ray import read_petastorm

    ds = read_petastorm('file:///tmp/hello_world')
    for batch in ds.iter_torch_batches(batch_size=64):
        ...

The ``ray`` extra (``pip install 'neo-petastorm[ray]'``) brings ``ray[data]`` and ``pydantic``. Ray is imported
only when these functions are called.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from petastorm._optional import import_optional

if TYPE_CHECKING:
    import ray.data

    from petastorm.unischema import Unischema

__all__ = ['PetastormDatasink', 'PetastormDatasource', 'read_petastorm', 'write_petastorm']


def read_petastorm(dataset_url: str | list[str], *, schema_fields: Any = None, predicate: Any = None,
                   filters: Any = None, rowgroup_selector: Any = None, storage_options: dict | None = None,
                   filesystem: Any = None, override_num_blocks: int | None = None, concurrency: int | None = None,
                   ray_remote_args: dict[str, Any] | None = None, table_version: Any = None,
                   table_format: str = 'auto') -> ray.data.Dataset:
    """A Ray Dataset of the rows of a Petastorm dataset, every field decoded as ``make_reader`` decodes it.

    Read tasks are planned on the driver from the dataset's row groups (after the selector, partition and
    statistics pruning) and read, filter and decode whole row groups in the Ray workers; each row group becomes
    one block. Arrays and images are Ray tensor columns with their dtype and shape, so ``iter_torch_batches``,
    ``iter_batches(batch_format='numpy')``, ``map_batches`` and Ray Train's dataset shards work on them. Reads
    datasets written by us, by Petastorm 0.13.1 and plain Parquet stores (schema inferred, as
    ``make_batch_reader`` does). Rows come in the dataset's order; use Ray's ``randomize_block_order()`` or
    ``random_shuffle()`` to shuffle. Ray pushes down column selections (``ds.select_columns``) and filters on
    scalar columns (``ds.filter(expr=...)``) into the read.

    Args:
        dataset_url: dataset directory URL, a list of Parquet file URLs, a Delta or Iceberg table's directory URL,
            or a ``pyiceberg`` table.
        schema_fields: fields to read (``UnischemaField`` s and/or regular expressions), as in ``make_reader``.
        predicate: a :class:`~petastorm.predicates.PredicateBase`, evaluated in the read tasks on decoded values.
        filters: pyarrow DNF filters (``[('col', '>', 3)]``), used to skip row groups and applied to rows.
        rowgroup_selector: a row-group selector (needs row-group indexes in the metadata).
        storage_options: fsspec options (credentials, endpoint) for remote URLs.
        filesystem: a ready pyarrow or fsspec filesystem, instead of resolving the URL.
        override_num_blocks: number of read tasks; more than there are row groups splits row groups into row
            ranges. Default: one per CPU of the Ray cluster (more for datasets of more than 128 MiB decoded per
            CPU), at most one per row group; every task yields one block per row group it reads.
        concurrency: most read tasks running at once (default: Ray's choice).
        ray_remote_args: options of the read tasks' ``ray.remote`` (``num_cpus``, ``memory``, ...).
        table_version: for a Delta or Iceberg table (a directory URL, or a ``pyiceberg`` table as
            ``dataset_url``), the version to read, as ``make_reader``'s ``table_version`` (default: the latest).
        table_format: ``'auto'``, ``'delta'``, ``'iceberg'`` or ``'parquet'``, as ``make_reader``'s.

    Raises:
        MissingDependencyError: Ray is not installed.
        ValueError: an argument is not valid (the message names it), or the dataset cannot be planned.
    """
    ray_data = import_optional('ray.data', 'read_petastorm')
    from petastorm.ray.datasource import PetastormDatasource

    datasource = PetastormDatasource(dataset_url, schema_fields=schema_fields, predicate=predicate,
                                     filters=filters, rowgroup_selector=rowgroup_selector,
                                     storage_options=storage_options, filesystem=filesystem,
                                     split_row_groups=override_num_blocks is not None,
                                     table_version=table_version, table_format=table_format)
    num_blocks = override_num_blocks if override_num_blocks is not None else datasource.default_num_tasks()
    return ray_data.read_datasource(datasource, override_num_blocks=num_blocks, concurrency=concurrency,
                                    ray_remote_args=ray_remote_args)


def write_petastorm(ds: ray.data.Dataset, dataset_url: str, schema: Unischema, *, row_group_size_mb: float = 32,
                    file_size_mb: float = 512, mode: Literal['error', 'overwrite'] = 'error',
                    compression: str | None = 'snappy', storage_options: dict | None = None,
                    filesystem: Any = None, legacy_metadata: bool = True,
                    concurrency: int | None = None) -> None:
    """Write a Ray Dataset as a Petastorm dataset: Parquet files of encoded rows plus ``_common_metadata``.

    The Dataset's columns must hold the schema's fields as values (numpy arrays or tensor columns for array
    and image fields); every write task encodes its rows with the fields' codecs and writes its own files, and
    the driver writes the metadata last. A failed write is rolled back, as :func:`petastorm.write_dataset` does.

    Args:
        ds: the Ray Dataset to write.
        dataset_url: target directory URL.
        schema: the Unischema of the rows.
        row_group_size_mb, file_size_mb, mode, compression, storage_options, filesystem, legacy_metadata: as in
            :func:`petastorm.write_dataset`.
        concurrency: most write tasks running at once (default: Ray's choice).

    Raises:
        MissingDependencyError: Ray is not installed.
        FileExistsError: the target holds data and ``mode='error'``.
        SchemaError: a row does not follow the schema (the message names the row and field).
        DatasetWriteError: the storage failed.
    """
    import_optional('ray.data', 'write_petastorm')
    from petastorm.ray.datasink import PetastormDatasink

    datasink = PetastormDatasink(dataset_url, schema, row_group_size_mb=row_group_size_mb,
                                 file_size_mb=file_size_mb, mode=mode, compression=compression,
                                 storage_options=storage_options, filesystem=filesystem,
                                 legacy_metadata=legacy_metadata)
    ds.write_datasink(datasink, concurrency=concurrency)


def __getattr__(name: str) -> Any:
    # The classes import Ray: load them only when asked for.
    if name == 'PetastormDatasource':
        import_optional('ray.data', name)
        from petastorm.ray.datasource import PetastormDatasource

        return PetastormDatasource
    if name == 'PetastormDatasink':
        import_optional('ray.data', name)
        from petastorm.ray.datasink import PetastormDatasink

        return PetastormDatasink
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
