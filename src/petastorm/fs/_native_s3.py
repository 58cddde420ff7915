"""``storage_options`` written for s3fs, read by pyarrow's own S3 client when they mean the same to it.

pyarrow's ``S3FileSystem`` (the AWS SDK for C++) costs about a third of the CPU per request that s3fs costs
(botocore and aiohttp, in Python), starts its client in milliseconds instead of a tenth of a second, and reads a
row group's column chunks in parallel without holding the GIL. So an ``s3://`` URL is read through it whenever
every option the user gave has a meaning it can take; anything else (a profile name, requester-pays buckets,
server-side encryption arguments, botocore settings it has no equivalent for) keeps s3fs, which understands it.

:func:`native_s3_options` is the translation, a pure function of the options and the environment;
:func:`native_s3_filesystem` makes the client. To read through s3fs anyway (its ETag checks, its credential
sources), pass ``filesystem=s3fs.S3FileSystem(...)``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlparse

__all__ = ['native_s3_filesystem', 'native_s3_options']

#: s3fs options that only tune its own caches: they change nothing about what is read.
_S3FS_CACHE_OPTIONS = frozenset({'default_block_size', 'default_fill_cache', 'default_cache_type',
                                 'skip_instance_cache', 'use_listings_cache', 'listings_expiry_time', 'max_paths',
                                 'cache_regions', 'max_concurrency'})
#: botocore ``Config`` settings that pyarrow's client replaces with its own.
_CONFIG_HANDLED_BY_PYARROW = frozenset({'max_pool_connections', 'tcp_keepalive', 'user_agent_extra'})
#: pyarrow's I/O threads (and so its S3 client's connections) once a reader uses its S3 client: as many as the
#: footers read at a time (store.footers.REMOTE_FOOTER_THREADS).
IO_THREADS = 64
#: what the AWS SDK reads from the environment itself (no region or endpoint given: the SDK's own chain).
_ENDPOINT_VARIABLES = ('AWS_ENDPOINT_URL_S3', 'AWS_ENDPOINT_URL')


def native_s3_options(storage_options: Mapping[str, Any] | None,
                      environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The keyword arguments of ``pyarrow.fs.S3FileSystem`` that mean what ``storage_options`` mean to s3fs.

    Args:
        storage_options: the user's s3fs options (``key``, ``secret``, ``token``, ``anon``, ``endpoint_url``,
            ``client_kwargs``, ``config_kwargs``, ``use_ssl`` and s3fs's cache settings translate).
        environ: the environment (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, which botocore reads and the AWS
            SDK for C++ does not).

    Returns:
        The arguments, or None when some option has no equivalent, or when the store is AWS itself and neither the
        options nor the environment name its region (then s3fs reads the URL).
    """
    options = dict(storage_options or {})
    client = dict(options.pop('client_kwargs', None) or {})
    config = dict(options.pop('config_kwargs', None) or {})
    for name in _S3FS_CACHE_OPTIONS:
        options.pop(name, None)
    arguments: dict[str, Any] = {}

    key = _first(options.pop('key', None), options.pop('username', None), client.pop('aws_access_key_id', None))
    secret = _first(options.pop('secret', None), options.pop('password', None),
                    client.pop('aws_secret_access_key', None))
    token = _first(options.pop('token', None), client.pop('aws_session_token', None))
    if key is not None or secret is not None:
        if key is None or secret is None:
            return None  # s3fs would complain or look elsewhere for the other half: leave it to s3fs
        arguments.update(access_key=key, secret_key=secret)
    if token is not None:
        if key is None:
            return None
        arguments['session_token'] = token
    if options.pop('anon', False):
        if key is not None:
            return None
        arguments['anonymous'] = True

    endpoint = options.pop('endpoint_url', None) or client.pop('endpoint_url', None)
    endpoint = endpoint or next((environ[name] for name in _ENDPOINT_VARIABLES if environ.get(name)), None)
    use_ssl = options.pop('use_ssl', True)
    if endpoint:
        parsed = urlparse(endpoint if '://' in endpoint else f'{"https" if use_ssl else "http"}://{endpoint}')
        if parsed.scheme not in ('http', 'https') or not parsed.netloc or parsed.path not in ('', '/') or \
                parsed.query:
            return None
        arguments.update(scheme=parsed.scheme, endpoint_override=parsed.netloc)
    elif not use_ssl:
        arguments['scheme'] = 'http'

    region = client.pop('region_name', None) or options.pop('region', None) or \
        environ.get('AWS_REGION') or environ.get('AWS_DEFAULT_REGION')
    if region:
        arguments['region'] = region
    elif endpoint:
        arguments['region'] = 'us-east-1'  # an S3-compatible server signs with any region; the SDK needs one
    else:
        # AWS itself in a region nobody named: s3fs follows AWS's redirects to the bucket's region, pyarrow's
        # client does not, and asking AWS first costs seconds where it cannot be reached.
        return None

    if not _translate_config(config, arguments):
        return None
    if options or client:
        return None  # an option pyarrow's client has no equivalent for
    return arguments


def _first(*values: Any) -> Any:
    """The first value that is not None (each was popped, so that none is left behind as unknown)."""
    return next((value for value in values if value is not None), None)


def _translate_config(config: dict[str, Any], arguments: dict[str, Any]) -> bool:
    """Add what botocore ``Config`` settings mean to pyarrow's client; False if one has no equivalent."""
    from pyarrow.fs import AwsStandardS3RetryStrategy

    retries = config.pop('retries', None)
    if retries is not None:
        retries = dict(retries)
        attempts = retries.pop('total_max_attempts', None) or retries.pop('max_attempts', None)
        retries.pop('mode', None)
        if retries:
            return False
        if attempts is not None:
            arguments['retry_strategy'] = AwsStandardS3RetryStrategy(max_attempts=max(1, int(attempts)))
    if config.get('connect_timeout') is not None:
        arguments['connect_timeout'] = float(config.pop('connect_timeout'))
    # read_timeout stays with s3fs: pyarrow's client applies its request timeout on Windows and macOS only.
    proxies = config.pop('proxies', None)
    if proxies:
        uris = set(proxies.values())
        if len(uris) != 1:
            return False  # one proxy per scheme: pyarrow's client takes one
        arguments['proxy_options'] = uris.pop()
    signature = config.pop('signature_version', None)
    if signature is not None and str(signature) not in ('s3v4', 'v4'):
        if str(signature) != 'UNSIGNED' or 'access_key' in arguments:
            return False
        arguments['anonymous'] = True
    s3_settings = dict(config.pop('s3', None) or {})
    if s3_settings.pop('addressing_style', None) == 'virtual':
        arguments['force_virtual_addressing'] = True
    if s3_settings:
        return False
    for name in _CONFIG_HANDLED_BY_PYARROW:
        config.pop(name, None)
    return not config


def native_s3_filesystem(storage_options: Mapping[str, Any] | None, environ: Mapping[str, str]) -> Any:
    """pyarrow's ``S3FileSystem`` for ``storage_options``, or None when they need s3fs (see the module docstring)."""
    arguments = native_s3_options(storage_options, environ)
    if arguments is None:
        return None
    import pyarrow as pa
    import pyarrow.fs as pafs

    # The client keeps as many connections as pyarrow's I/O pool has threads (8 by default): footers and row
    # groups are read as many at a time as the reader asks only with more. The pool is pyarrow's, for the process.
    if pa.io_thread_count() < IO_THREADS:
        pa.set_io_thread_count(IO_THREADS)
    return pafs.S3FileSystem(**arguments)
