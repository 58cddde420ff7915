"""The storage options of Parquet URLs, translated for the table libraries that read the logs themselves.

Readers take fsspec's ``storage_options`` (s3fs: ``key``, ``secret``, ``token``, ``endpoint_url``,
``client_kwargs``, ``anon``). The data files of a table are read with those, as any Parquet file; the Delta log is
read by delta-rs and Iceberg metadata by pyiceberg's file IO, which name the same settings otherwise. Options
already in their own form (``AWS_ACCESS_KEY_ID``, ``s3.endpoint``) pass through unchanged.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlparse


def _s3_settings(options: dict[str, Any]) -> dict[str, Any]:
    client = dict(options.get('client_kwargs') or {})
    return {
        'key': options.get('key') or options.get('aws_access_key_id') or client.get('aws_access_key_id'),
        'secret': options.get('secret') or options.get('aws_secret_access_key') or client.get(
            'aws_secret_access_key'),
        'token': options.get('token') or options.get('aws_session_token') or client.get('aws_session_token'),
        'endpoint': options.get('endpoint_url') or client.get('endpoint_url'),
        'region': options.get('region_name') or client.get('region_name'),
        'anon': bool(options.get('anon')),
    }


def delta_storage_options(url: str, storage_options: dict[str, Any] | None) -> dict[str, str]:
    """delta-rs's ``storage_options`` for a table at ``url`` from fsspec-style ones."""
    options = dict(storage_options or {})
    # delta-rs's own keys (AWS_REGION, aws_..., google_..., azure_...) pass as they are; the three credential
    # names botocore shares with them are translated below instead.
    translated = ('aws_access_key_id', 'aws_secret_access_key', 'aws_session_token')
    passed = {k: str(v) for k, v in options.items()
              if k.isupper() or (k.startswith(('aws_', 'google_', 'azure_')) and k not in translated)}
    scheme = urlparse(url).scheme.lower()
    if scheme not in ('s3', 's3a'):
        return passed
    s3 = _s3_settings(options)
    result: dict[str, str] = {}
    if s3['key']:
        result['AWS_ACCESS_KEY_ID'] = str(s3['key'])
    if s3['secret']:
        result['AWS_SECRET_ACCESS_KEY'] = str(s3['secret'])
    if s3['token']:
        result['AWS_SESSION_TOKEN'] = str(s3['token'])
    if s3['endpoint']:
        result['AWS_ENDPOINT_URL'] = str(s3['endpoint'])
        if str(s3['endpoint']).startswith('http://'):
            result['AWS_ALLOW_HTTP'] = 'true'
    if s3['region']:
        result['AWS_REGION'] = str(s3['region'])
    if s3['anon']:
        result['AWS_SKIP_SIGNATURE'] = 'true'
    result.update(passed)
    return result


def iceberg_io_properties(url: str, storage_options: dict[str, Any] | None) -> dict[str, str]:
    """pyiceberg's file IO properties for a table at ``url`` from fsspec-style ``storage_options``."""
    options = dict(storage_options or {})
    passed = {k: str(v) for k, v in options.items() if '.' in k}
    if urlparse(url).scheme.lower() not in ('s3', 's3a'):
        return passed
    s3 = _s3_settings(options)
    names = {'key': 's3.access-key-id', 'secret': 's3.secret-access-key', 'token': 's3.session-token',
             'endpoint': 's3.endpoint', 'region': 's3.region'}
    result = {names[k]: str(v) for k, v in s3.items() if k in names and v}
    if s3['anon']:
        result['s3.anonymous'] = 'true'
    result.update(passed)
    return result
