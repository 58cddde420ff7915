"""pyarrow's own ``S3FileSystem`` from :class:`~petastorm.fs.settings.s3.S3Settings`, when every option means the same.

pyarrow's ``S3FileSystem`` (the AWS SDK for C++) costs about a third of the CPU per request that s3fs costs
(botocore and aiohttp, in Python), starts its client in milliseconds instead of a tenth of a second, and reads a
row group's column chunks in parallel without holding the GIL. So an ``s3://`` URL is read through it whenever
every option the user gave has a meaning it can take; anything else (a profile name, requester-pays buckets,
server-side encryption arguments, botocore settings it has no equivalent for) keeps s3fs, which understands it.

:func:`pyarrow_s3_arguments` is the translation, a pure function of the settings and the environment, in named
steps (credentials, endpoint, region, botocore ``Config``); each says None when it has no equivalent.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from petastorm.fs.settings._table import endpoint_parts
from petastorm.fs.settings.s3 import S3Settings, full_endpoint, s3_endpoint

__all__ = ['pyarrow_s3_arguments']

#: s3fs options that only tune its own caches: they change nothing about what is read.
_S3FS_CACHE_OPTIONS = frozenset({'default_block_size', 'default_fill_cache', 'default_cache_type',
                                 'skip_instance_cache', 'use_listings_cache', 'listings_expiry_time', 'max_paths',
                                 'cache_regions', 'max_concurrency'})
#: botocore ``Config`` settings that pyarrow's client replaces with its own.
_CONFIG_HANDLED_BY_PYARROW = frozenset({'max_pool_connections', 'tcp_keepalive', 'user_agent_extra'})
#: the botocore ``Config`` settings translated (each by a step of :func:`_config_arguments`).
_CONFIG_TRANSLATED = frozenset({'retries', 'connect_timeout', 'proxies', 'signature_version', 's3'})
_RETRY_SETTINGS = frozenset({'total_max_attempts', 'max_attempts', 'mode'})


def pyarrow_s3_arguments(settings: S3Settings, environ: Mapping[str, str]) -> dict[str, Any] | None:
    """The keyword arguments of ``pyarrow.fs.S3FileSystem`` that mean what the settings mean to s3fs.

    Args:
        settings: the user's options, read.
        environ: the environment (``AWS_ENDPOINT_URL_S3``/``AWS_ENDPOINT_URL``, which botocore reads and the AWS
            SDK for C++ does not; ``AWS_REGION``/``AWS_DEFAULT_REGION``).

    Returns:
        The arguments, or None when some option has no equivalent, or when the store is AWS itself and neither the
        options nor the environment name its region (then s3fs reads the URL).
    """
    if settings.client_kwargs or set(settings.s3fs_options) - _S3FS_CACHE_OPTIONS:
        return None  # an option pyarrow's client has no equivalent for
    endpoint = s3_endpoint(settings, environ)
    arguments = _merged(_credentials(settings), _endpoint(endpoint, settings.use_ssl),
                        _region(settings.region, endpoint, environ))
    if arguments is None:
        return None
    config = _config_arguments(settings.config_kwargs, has_key='access_key' in arguments)
    return None if config is None else {**arguments, **config}


def _merged(*parts: dict[str, Any] | None) -> dict[str, Any] | None:
    """The parts' arguments together; None when any part has no equivalent."""
    if any(part is None for part in parts):
        return None
    return {name: value for part in parts if part is not None for name, value in part.items()}


def _credentials(settings: S3Settings) -> dict[str, Any] | None:
    key, secret, token = settings.key, settings.secret, settings.token
    arguments: dict[str, Any] = {}
    if key is not None or secret is not None:
        if key is None or secret is None:
            return None  # s3fs would complain or look elsewhere for the other half: leave it to s3fs
        arguments.update(access_key=key, secret_key=secret)
    if token is not None:
        if key is None:
            return None
        arguments['session_token'] = token
    if settings.anon:
        if key is not None:
            return None
        arguments['anonymous'] = True
    return arguments


def _endpoint(endpoint: str | None, use_ssl: Any) -> dict[str, Any] | None:
    if not endpoint:
        return {'scheme': 'http'} if use_ssl is False else {}
    parts = endpoint_parts(full_endpoint(endpoint, use_ssl))
    return None if parts is None else {'scheme': parts[0], 'endpoint_override': parts[1]}


def _region(region: str | None, endpoint: str | None, environ: Mapping[str, str]) -> dict[str, Any] | None:
    region = region or environ.get('AWS_REGION') or environ.get('AWS_DEFAULT_REGION')
    if region:
        return {'region': region}
    if endpoint:
        return {'region': 'us-east-1'}  # an S3-compatible server signs with any region; the SDK needs one
    # AWS itself in a region nobody named: s3fs follows AWS's redirects to the bucket's region, pyarrow's client
    # does not, and asking AWS first costs seconds where it cannot be reached.
    return None


def _config_arguments(config: Mapping[str, Any], has_key: bool) -> dict[str, Any] | None:
    """What botocore ``Config`` settings mean to pyarrow's client; None if one has no equivalent."""
    if set(config) - _CONFIG_TRANSLATED - _CONFIG_HANDLED_BY_PYARROW:
        return None
    # read_timeout stays with s3fs: pyarrow's client applies its request timeout on Windows and macOS only.
    return _merged(_retries(config.get('retries')), _connect_timeout(config), _proxy(config.get('proxies')),
                   _signature(config.get('signature_version'), has_key), _addressing(config.get('s3')))


def _retries(retries: Mapping[str, Any] | None) -> dict[str, Any] | None:
    if retries is None:
        return {}
    if set(retries) - _RETRY_SETTINGS:
        return None
    attempts = retries.get('total_max_attempts') or retries.get('max_attempts')
    if attempts is None:
        return {}
    from pyarrow.fs import AwsStandardS3RetryStrategy

    return {'retry_strategy': AwsStandardS3RetryStrategy(max_attempts=max(1, int(attempts)))}


def _connect_timeout(config: Mapping[str, Any]) -> dict[str, Any] | None:
    if 'connect_timeout' not in config:
        return {}
    timeout = config['connect_timeout']
    return None if timeout is None else {'connect_timeout': float(timeout)}


def _proxy(proxies: Mapping[str, str] | None) -> dict[str, Any] | None:
    if not proxies:
        return {}
    uris = set(proxies.values())
    return {'proxy_options': uris.pop()} if len(uris) == 1 else None  # pyarrow's client takes one for every scheme


def _signature(signature: Any, has_key: bool) -> dict[str, Any] | None:
    if signature is None or str(signature) in ('s3v4', 'v4'):
        return {}
    if str(signature) != 'UNSIGNED' or has_key:
        return None
    return {'anonymous': True}


def _addressing(s3: Mapping[str, Any] | None) -> dict[str, Any] | None:
    settings = dict(s3 or {})
    style = settings.pop('addressing_style', None)
    if settings:
        return None
    return {'force_virtual_addressing': True} if style == 'virtual' else {}
