"""One read of one store from S3, GCS or Azure (an endpoint on loopback), by one system, in a fresh process: the
cases of remote_bench.

Run by ``remote_bench.py`` as ``python remote_cases.py SYSTEM STORE_URL ENDPOINT [--workers W] [--batch-size B]``; it
prints one JSON line: rows, seconds for the epoch (from making the reader to its last batch), seconds to the first
batch, CPU seconds (this process and its children), peak RSS (this process and its descendants, sampled) and the
system's versions.

The systems, each read as its users read it, with every image and array decoded:

* ``ours``: ``make_batch_reader`` (thread pool) over ``storage_options``; it decodes the Petastorm fields itself.
  ``ours-loader``: the same reader through ``BatchedDataLoader(batch_size=256)`` (torch imported before the clock
  starts), whose first batch comes before the first row group is decoded whole; ``ours-loader-whole``: the same
  with the reader's first item read whole, for comparison. Both are seeded, so both read the same row group first.
* ``petastorm``: Petastorm 0.13.1 in its side environment (this file runs there too: it imports nothing of the
  project). ``make_batch_reader`` for plain Parquet, ``make_reader`` for Petastorm datasets (its batch reader does
  not decode their fields). Its fsspec path cannot open S3 on the last pyarrow it runs on (``validate_schema`` is
  refused by the new dataset API), so it gets s3fs through pyarrow's legacy ``S3FSWrapper``, whose ``walk`` is given
  the synchronous ``ls`` that today's s3fs keeps (its ``_ls`` became a coroutine).
* ``hf``: Hugging Face ``datasets`` streaming (``load_dataset('parquet', streaming=True)``, Arrow format).
* ``ray``: Ray Data ``read_parquet`` with pyarrow's client of the cloud and ``map_batches`` decoding (Ray's own
  parallel tasks); the clock starts after ``ray.init``, which a training job pays once.
* ``raw``: the limit: pyarrow's client of the cloud (``S3FileSystem``, ``GcsFileSystem``, ``AzureFileSystem``)
  listing the files and reading their row groups (the same columns, pre-buffered) with as many threads as the
  others have workers, then decoding them; ``raw-bytes`` skips the decoding. Its clock, as ours, includes reading
  the schema that says how to decode (``_common_metadata``, with the same client, while the files are listed).

On GCS and Azure, ``hf`` reads through gcsfs and adlfs (fsspec), as its users do; Petastorm 0.13.1 runs on S3 only.

* ``ours-disk-cache``, ``ours-decoded-cache``: a first epoch from S3 fills ``cache_type='local-disk'`` (raw row
  groups) or ``'local-disk-decoded'``; the clock times the second epoch, served by the cache. ``ours-local``: the
  same store read from local disk (``--local-root``), the speed such an epoch should reach.
* ``arrow-dataset``: ``pyarrow.dataset`` scanning the store with its own threads (for the planning benchmark).
  ``hf-plain``: ``hf`` on plain Parquet (for the planning benchmark): no Petastorm schema asked first, so the
  requests counted are all Hugging Face's.
* ``capacity``: every object read whole: what the server and the network deliver.

``hf``, ``ray`` and ``raw`` decode a Petastorm dataset's fields with this project's codecs (the same decoders our
reader uses), so what differs is how the bytes arrive.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import resource
import sys
import threading
import time
import warnings

ACCESS = {'key': 'bench', 'secret': 'bench'}


class PeakRss:
    """Samples the resident memory of this process and its descendants every 20 ms; ``peak`` is the largest sum."""

    def __init__(self) -> None:
        self.peak = 0
        self._stop = threading.Event()
        try:
            import psutil

            self._process = psutil.Process()
        except ImportError:
            self._process = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _sample(self) -> int:
        total = self._process.memory_info().rss
        for child in self._process.children(recursive=True):
            try:
                total += child.memory_info().rss
            except Exception:  # a child that exited between the listing and the reading
                pass
        return total

    def _run(self) -> None:
        while self._process is not None and not self._stop.is_set():
            self.peak = max(self.peak, self._sample())
            self._stop.wait(0.02)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        return max(self.peak, own)


def cpu_seconds() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def store_options(url: str, endpoint: str) -> dict:
    """The ``storage_options`` of a store at ``endpoint``: the S3 server's, fake-gcs-server's or Azurite's."""
    scheme = url.split('://', 1)[0]
    if scheme == 'gs':
        return {'endpoint_url': endpoint, 'token': 'anon', 'project': 'bench'}
    if scheme == 'abfs':
        from petastorm.fs.settings.azure import DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY

        return {'connection_string': f'DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};'
                                     f'AccountKey={DEVELOPMENT_KEY};BlobEndpoint={endpoint}/{DEVELOPMENT_ACCOUNT};'}
    return dict(ACCESS, client_kwargs={'endpoint_url': endpoint})


def arrow_filesystem(url: str, endpoint: str):
    """pyarrow's own client of the store's cloud at ``endpoint`` (S3, GCS or Azure)."""
    import pyarrow.fs as pafs

    scheme, host = url.split('://', 1)[0], endpoint.split('://', 1)[1]
    if scheme == 'gs':
        return pafs.GcsFileSystem(anonymous=True, scheme='http', endpoint_override=host, project_id='bench')
    if scheme == 'abfs':
        from petastorm.fs.settings.azure import DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY

        return pafs.AzureFileSystem(account_name=DEVELOPMENT_ACCOUNT, account_key=DEVELOPMENT_KEY,
                                    blob_storage_authority=host, dfs_storage_authority=host,
                                    blob_storage_scheme='http', dfs_storage_scheme='http')
    return pafs.S3FileSystem(endpoint_override=host, scheme='http', access_key=ACCESS['key'],
                             secret_key=ACCESS['secret'], region='us-east-1')


def bucket_path(url: str) -> str:
    return url.split('://', 1)[1].rstrip('/')


class FirstBatchOnly(Exception):
    """Raised at the first batch when only the time to it is measured (``--first-only``)."""


def first_batch(clock: dict) -> None:
    """Note the time of the first batch; with ``--first-only``, stop the read there."""
    clock.setdefault('first', time.perf_counter())
    if clock.get('first_only'):
        raise FirstBatchOnly


# --------------------------------------------------------------------------------------------- our decoders


def petastorm_decoders(url: str, endpoint: str) -> dict:
    """``{column: decode(arrow column) -> values}`` for the Petastorm fields of a store (empty for plain Parquet)."""
    from petastorm.errors import PetastormMetadataError
    from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

    try:
        schema = get_schema_from_dataset_url(url, storage_options=store_options(url, endpoint))
    except PetastormMetadataError:
        return {}
    return _decoders_of(schema)


def _decoders_of(schema) -> dict:
    """``{column: decode(arrow column) -> values}`` for the fields of a Unischema that a codec decodes."""
    return {field.name: (lambda column, field=field: field.codec.decode_column(field, column))
            for field in schema.fields.values() if field.codec is not None and
            type(field.codec).__name__ != 'ScalarCodec'}


def decode_table(table, decoders: dict) -> int:
    for name, decode in decoders.items():
        decode(table.column(name))
    return table.num_rows


# ------------------------------------------------------------------------------------------------- systems


def read_ours(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    return _read_all(url, workers, clock, storage_options=store_options(url, endpoint))


def read_ours_in_order(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``ours`` with ``shuffle_row_groups=False``, as ``pyarrow.dataset`` reads: the first rows come while the
    footers of a store without a ``_metadata`` summary are still being read."""
    return _read_all(url, workers, clock, storage_options=store_options(url, endpoint), shuffle_row_groups=False)


#: per scheme, an option that only the fsspec client takes (and changes nothing read): the store is read through
#: s3fs, gcsfs or adlfs, as a user's options that pyarrow's own client has no equivalent for make it.
_FSSPEC_ONLY = {'s3': {'config_kwargs': {'read_timeout': 60}}, 'gs': {'consistency': 'size'},
                'abfs': {'location_mode': 'primary'}}


def read_ours_fsspec(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``ours`` through the cloud's fsspec client (s3fs, gcsfs, adlfs) instead of pyarrow's own."""
    options = {**store_options(url, endpoint), **_FSSPEC_ONLY[url.split('://', 1)[0]]}
    return _read_all(url, workers, clock, storage_options=options)


def _read_all(url: str, workers: int, clock: dict | None, **reader_args: object) -> int:
    from petastorm import make_batch_reader

    rows = 0
    with make_batch_reader(url, reader_pool_type='thread', workers_count=workers, **reader_args) as reader:
        for batch in reader:
            if clock is not None:
                first_batch(clock)
            rows += len(batch[0])
    return rows


def _read_cached(url: str, endpoint: str, workers: int, clock: dict, cache_type: str) -> int:
    """A first epoch from S3 fills a local cache (untimed); the clock times the second, which the cache serves."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix='remote-cache-') as directory:
        cache = {'cache_type': cache_type, 'cache_location': directory, 'cache_size_limit': 1 << 40,
                 'cache_row_size_estimate': 1 << 10, 'cache_extra_settings': {'cleanup': False}}
        _read_all(url, workers, None, storage_options=store_options(url, endpoint), **cache)
        clock['start'] = time.perf_counter()
        return _read_all(url, workers, clock, storage_options=store_options(url, endpoint), **cache)


def read_ours_disk_cache(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    return _read_cached(url, endpoint, workers, clock, 'local-disk')


def read_ours_decoded_cache(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    return _read_cached(url, endpoint, workers, clock, 'local-disk-decoded')


def read_ours_loader(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``BatchedDataLoader`` over ``make_batch_reader``: what a torch user iterates. Its first batch needs
    ``batch_size`` rows, which the reader delivers before the rest of the first row group is decoded."""
    return _read_through_loader(url, endpoint, workers, batch_size, clock, whole_first_item=False)


def read_ours_loader_whole(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``ours-loader`` with the reader's first item read whole, as before loaders asked for their first rows."""
    return _read_through_loader(url, endpoint, workers, batch_size, clock, whole_first_item=True)


class _WholeItems:
    """A reader, with the loader's ``first_rows`` not passed on (its items are read whole)."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def column_batches(self, first_rows=None):
        return self._reader.column_batches()


def _read_through_loader(url: str, endpoint: str, workers: int, batch_size: int, clock: dict,
                         whole_first_item: bool) -> int:
    from petastorm import make_batch_reader
    from petastorm.pytorch import BatchedDataLoader

    rows = 0
    reader = make_batch_reader(url, reader_pool_type='thread', workers_count=workers, seed=0,
                               storage_options=store_options(url, endpoint))
    with BatchedDataLoader(_WholeItems(reader) if whole_first_item else reader, batch_size=batch_size) as loader:
        for batch in loader:
            first_batch(clock)
            rows += len(next(iter(batch.values())))
    return rows


def read_ours_local(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """The same store read by our reader from local disk (``--local-root``): the speed a cache should reach."""
    return _read_all('file://' + os.path.join(clock['local_root'], bucket_path(url)), workers, clock)


def _legacy_s3fs(url: str, endpoint: str):
    import pyarrow.filesystem as legacy_fs
    import s3fs

    class Wrapper(legacy_fs.S3FSWrapper):
        def walk(self, path, refresh=False):
            path = path.rstrip('/')
            directories, files = [], []
            for info in self.fs.ls(path, detail=True, refresh=refresh):
                name = info['name'].rstrip('/')
                if name != path:
                    (directories if info['type'] == 'directory' else files).append(name.rsplit('/', 1)[-1])
            yield path, directories, files
            for directory in directories:
                yield from self.walk(f'{path}/{directory}', refresh)

    return Wrapper(s3fs.S3FileSystem(**store_options(url, endpoint)))


def read_petastorm(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    from petastorm import make_batch_reader, make_reader
    from petastorm.etl.dataset_metadata import get_schema_from_dataset_url

    filesystem = _legacy_s3fs(url, endpoint)
    try:
        get_schema_from_dataset_url(url, storage_options=store_options(url, endpoint))
        petastorm_dataset = True
    except Exception:  # plain Parquet (its exception types moved between releases)
        petastorm_dataset = False
    rows = 0
    if petastorm_dataset:
        with make_reader(url, filesystem=filesystem, reader_pool_type='thread', workers_count=workers,
                         num_epochs=1) as reader:
            for _ in reader:
                first_batch(clock)
                rows += 1
    else:
        with make_batch_reader(url, filesystem=filesystem, reader_pool_type='thread', workers_count=workers,
                               num_epochs=1) as reader:
            for batch in reader:
                first_batch(clock)
                rows += len(batch[0])
    return rows


def read_hf(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    decoders = petastorm_decoders(url, endpoint)
    clock['start'] = time.perf_counter()
    return _hf_stream(url, endpoint, batch_size, clock, decoders)


def read_hf_plain(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``hf`` on plain Parquet, without first asking the store for a Petastorm schema (which lists it): every
    request the server counts is then Hugging Face's own."""
    return _hf_stream(url, endpoint, batch_size, clock, {})


def _hf_stream(url: str, endpoint: str, batch_size: int, clock: dict, decoders: dict) -> int:
    from datasets import load_dataset

    dataset = load_dataset('parquet', data_files={'train': f'{url}/*.parquet'}, split='train', streaming=True,
                           storage_options=store_options(url, endpoint)).with_format('arrow')
    rows = 0
    for table in dataset.iter(batch_size=batch_size):
        rows += decode_table(table, decoders)
        first_batch(clock)
    return rows


def read_ray(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    import ray

    decoders = petastorm_decoders(url, endpoint)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level='ERROR')
    clock['start'] = time.perf_counter()
    dataset = ray.data.read_parquet(bucket_path(url), filesystem=arrow_filesystem(url, endpoint),
                                    file_extensions=['parquet'])
    if decoders:
        def decode(table):
            return {name: decoders[name](table.column(name)) if name in decoders else table.column(name).to_numpy()
                    for name in table.column_names}

        dataset = dataset.map_batches(decode, batch_format='pyarrow', batch_size=batch_size)
    rows = 0
    for batch in dataset.iter_batches(batch_size=batch_size, batch_format='numpy'):
        first_batch(clock)
        rows += len(next(iter(batch.values())))
    return rows


def _decoders_of_kv(kv: dict) -> dict:
    """:func:`petastorm_decoders` from the key-value metadata of a store's ``_common_metadata`` (empty: none)."""
    from petastorm.metadata.legacy import unischema_from_legacy_pickle
    from petastorm.metadata.schema_json import unischema_from_json
    from petastorm.store.keys import SCHEMA_JSON_KEY, UNISCHEMA_KEY

    if SCHEMA_JSON_KEY in kv:
        return _decoders_of(unischema_from_json(kv[SCHEMA_JSON_KEY]))
    if UNISCHEMA_KEY in kv:
        return _decoders_of(unischema_from_legacy_pickle(kv[UNISCHEMA_KEY]))
    return {}


def _raw_decoders(filesystem, path: str) -> dict:
    """The decoders of a store's Petastorm fields, read with pyarrow's own client from ``_common_metadata`` (none
    for plain Parquet, where that file is missing)."""
    import pyarrow.parquet as pq

    try:
        with filesystem.open_input_file(f'{path}/_common_metadata') as handle:
            kv = pq.read_metadata(handle).metadata or {}
    except FileNotFoundError:
        return {}
    return _decoders_of_kv(kv)


def _raw_read(url: str, endpoint: str, workers: int, clock: dict, decode: bool) -> int:
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.dataset as ds

    # pyarrow's dataset discovery keeps each file's size from the listing, so no file is asked for its size again;
    # the footers are read once, then each row group's column chunks in coalesced requests (pre_buffer). The
    # schema that says how to decode (``_common_metadata``) is read meanwhile, inside the clock as ours reads it.
    filesystem = arrow_filesystem(url, endpoint)
    file_format = ds.ParquetFileFormat(default_fragment_scan_options=ds.ParquetFragmentScanOptions(pre_buffer=True))
    with ThreadPoolExecutor(workers) as pool:
        decoders = pool.submit(_raw_decoders, filesystem, bucket_path(url)) if decode else None
        dataset = ds.dataset(bucket_path(url), filesystem=filesystem, format=file_format)
        fragments = list(dataset.get_fragments())
        list(pool.map(lambda fragment: fragment.ensure_complete_metadata(), fragments))
        row_groups = [row_group for fragment in fragments for row_group in fragment.split_by_row_group()]
        decoding = decoders.result() if decoders is not None else {}
        rows = 0
        # Decoders release the GIL: the pool's threads decode as the readers' workers do.
        for count in pool.map(lambda row_group: decode_table(row_group.to_table(use_threads=False), decoding),
                              row_groups):
            first_batch(clock)
            rows += count
    return rows


def read_raw(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    return _raw_read(url, endpoint, workers, clock, decode=True)


def read_raw_bytes(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    return _raw_read(url, endpoint, workers, clock, decode=False)


def read_arrow_dataset(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """``pyarrow.dataset`` used as its documentation shows: one scanner over the files, pyarrow's own threads."""
    import pyarrow.dataset as ds

    dataset = ds.dataset(bucket_path(url), filesystem=arrow_filesystem(url, endpoint), format='parquet')
    rows = 0
    for batch in dataset.to_batches():
        first_batch(clock)
        rows += batch.num_rows
    return rows


def read_capacity(url: str, endpoint: str, workers: int, batch_size: int, clock: dict) -> int:
    """Every object under ``url`` read whole, ``workers`` at a time: what the server and the network deliver."""
    from concurrent.futures import ThreadPoolExecutor

    import pyarrow.fs as pafs

    fs = arrow_filesystem(url, endpoint)
    infos = [info for info in fs.get_file_info(pafs.FileSelector(bucket_path(url), recursive=True)) if info.is_file]
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(lambda info: len(fs.open_input_file(info.path).read()), infos))


#: modules imported before the clock starts: what a training script imports at its top (``from petastorm import
#: make_batch_reader``, ``import datasets``...). What a library imports when it is first called counts.
PRELOAD = {'ours': ['petastorm.reader'], 'ours-in-order': ['petastorm.reader'], 'ours-fsspec': ['petastorm.reader'],
           'ours-loader': ['petastorm.reader', 'petastorm.pytorch'],
           'ours-loader-whole': ['petastorm.reader', 'petastorm.pytorch'],
           'ours-disk-cache': ['petastorm.reader'],
           'ours-decoded-cache': ['petastorm.reader'], 'ours-local': ['petastorm.reader'],
           'petastorm': ['petastorm.reader'], 'hf': ['datasets', 'petastorm'], 'ray': ['ray', 'ray.data', 'petastorm'],
           'raw': ['pyarrow.dataset', 'petastorm.reader'], 'raw-bytes': ['pyarrow.dataset'],
           'arrow-dataset': ['pyarrow.dataset'], 'capacity': ['pyarrow.fs']}

SYSTEMS = {'ours': read_ours, 'ours-in-order': read_ours_in_order, 'ours-fsspec': read_ours_fsspec,
           'ours-loader': read_ours_loader,
           'ours-loader-whole': read_ours_loader_whole,
           'ours-disk-cache': read_ours_disk_cache, 'ours-decoded-cache': read_ours_decoded_cache,
           'ours-local': read_ours_local, 'petastorm': read_petastorm, 'hf': read_hf, 'ray': read_ray, 'raw': read_raw,
           'raw-bytes': read_raw_bytes, 'arrow-dataset': read_arrow_dataset, 'capacity': read_capacity}
SYSTEMS['hf-plain'], PRELOAD['hf-plain'] = read_hf_plain, ['datasets']


def versions(system: str) -> dict:
    import numpy
    import pyarrow

    out = {'numpy': numpy.__version__, 'pyarrow': pyarrow.__version__}
    module = 'petastorm' if system.startswith('ours') else \
        {'petastorm': 'petastorm', 'hf': 'datasets', 'hf-plain': 'datasets', 'ray': 'ray'}.get(system)
    if module:
        out[module] = sys.modules[module].__version__
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('system', choices=sorted(SYSTEMS))
    parser.add_argument('url', help='s3://bucket/store, gs://bucket/store or abfs://container/store')
    parser.add_argument('endpoint', help='http://127.0.0.1:PORT')
    parser.add_argument('--workers', type=int, default=4)
    parser.add_argument('--batch-size', type=int, default=256)
    parser.add_argument('--first-only', action='store_true', help='stop at the first batch (rows is then -1)')
    parser.add_argument('--local-root', help='the directory the server serves (for ours-local)')
    args = parser.parse_args()
    warnings.simplefilter('ignore')
    for module in PRELOAD[args.system] + (['petastorm.fs.settings.azure'] if args.url.startswith('abfs') else []):
        importlib.import_module(module)
    rss = PeakRss()
    clock = {'start': time.perf_counter(), 'first_only': args.first_only, 'local_root': args.local_root}
    cpu = cpu_seconds()
    try:
        rows = SYSTEMS[args.system](args.url, args.endpoint, args.workers, args.batch_size, clock)
    except FirstBatchOnly:
        rows = -1
    end = time.perf_counter()
    result = {'rows': rows, 'seconds': end - clock['start'], 'first_batch': clock.get('first', end) - clock['start'],
              'cpu': cpu_seconds() - cpu, 'peak_rss': rss.stop(), 'versions': versions(args.system)}
    print(json.dumps(result), flush=True)


if __name__ == '__main__':
    main()
