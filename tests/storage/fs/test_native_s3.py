"""storage_options written for s3fs, translated for pyarrow's own S3 client only where they mean the same."""

from __future__ import annotations

import pytest

from petastorm.fs.settings import native_s3_options


def _strategy_attempts(arguments: dict) -> int:
    return arguments['retry_strategy'].max_attempts


def test_keys_endpoint_and_region_translate():
    arguments = native_s3_options({'key': 'K', 'secret': 'S', 'token': 'T',
                                   'client_kwargs': {'endpoint_url': 'http://127.0.0.1:9000', 'region_name': 'eu-x'}},
                                  {})
    assert arguments == {'access_key': 'K', 'secret_key': 'S', 'session_token': 'T', 'scheme': 'http',
                         'endpoint_override': '127.0.0.1:9000', 'region': 'eu-x'}


def test_an_endpoint_gets_a_region_and_aws_needs_one_named():
    assert native_s3_options({'endpoint_url': 'https://minio.local'}, {})['region'] == 'us-east-1'
    assert native_s3_options({'endpoint_url': 'https://minio.local'}, {})['scheme'] == 'https'
    assert native_s3_options({}, {'AWS_DEFAULT_REGION': 'ap-y'}) == {'region': 'ap-y'}
    assert native_s3_options({'client_kwargs': {'region_name': 'eu-z'}}, {}) == {'region': 'eu-z'}
    # AWS in a region nobody named: s3fs follows AWS's redirect to it, pyarrow's client would fail
    assert native_s3_options({'key': 'K', 'secret': 'S'}, {}) is None


def test_the_endpoint_variables_botocore_reads_are_passed_on():
    # The AWS SDK for C++ does not read AWS_ENDPOINT_URL; s3fs (botocore) does, so the translation must.
    arguments = native_s3_options({'anon': True}, {'AWS_ENDPOINT_URL': 'http://10.0.0.1:9000'})
    assert arguments == {'anonymous': True, 'scheme': 'http', 'endpoint_override': '10.0.0.1:9000',
                         'region': 'us-east-1'}
    both = {'AWS_ENDPOINT_URL': 'http://a:1', 'AWS_ENDPOINT_URL_S3': 'http://b:2'}
    assert native_s3_options(None, both)['endpoint_override'] == 'b:2'


def test_botocore_settings_with_an_equivalent_translate():
    arguments = native_s3_options({'region': 'r', 'config_kwargs': {'retries': {'max_attempts': 7, 'mode': 'standard'},
                                                     'connect_timeout': 3, 'max_pool_connections': 64,
                                                     'proxies': {'http': 'http://p:3128', 'https': 'http://p:3128'},
                                                     's3': {'addressing_style': 'virtual'}}}, {})
    assert _strategy_attempts(arguments) == 7
    assert arguments['connect_timeout'] == 3.0
    assert arguments['proxy_options'] == 'http://p:3128'
    assert arguments['force_virtual_addressing'] is True
    assert native_s3_options({'region': 'r', 'config_kwargs': {'signature_version': 'UNSIGNED'}}, {})['anonymous']


def test_s3fs_cache_settings_change_nothing_read():
    assert native_s3_options({'key': 'K', 'secret': 'S', 'default_block_size': 1 << 20, 'region': 'r',
                              'use_listings_cache': False, 'skip_instance_cache': True}, {}) == \
        {'access_key': 'K', 'secret_key': 'S', 'region': 'r'}


@pytest.mark.parametrize('options', [
    {'profile': 'dev'},  # a named profile: pyarrow's client takes none
    {'requester_pays': True},
    {'s3_additional_kwargs': {'ServerSideEncryption': 'aws:kms'}},
    {'version_aware': True},
    {'key': 'K'},  # half a key pair: s3fs decides where the other half comes from
    {'key': 'K', 'secret': 'S', 'anon': True},
    {'endpoint_url': 'http://host:9000/prefix'},
    {'client_kwargs': {'verify': False}},
    {'config_kwargs': {'read_timeout': 5}},  # pyarrow applies a request timeout on Windows and macOS only
    {'config_kwargs': {'retries': {'max_attempts': 3, 'something': 1}}},
    {'config_kwargs': {'proxies': {'http': 'http://a:1', 'https': 'http://b:2'}}},
    {'config_kwargs': {'signature_version': 's3'}},
    {'config_kwargs': {'s3': {'use_accelerate_endpoint': True}}},
])
def test_what_pyarrow_cannot_take_stays_with_s3fs(options):
    assert native_s3_options(options, {}) is None
    # with an endpoint given, only the option itself decides
    assert native_s3_options(options, {'AWS_ENDPOINT_URL': 'http://h:1'}) is None
    assert native_s3_options({}, {'AWS_ENDPOINT_URL': 'http://h:1'}) is not None


def test_the_options_are_not_changed():
    options = {'key': 'K', 'secret': 'S', 'client_kwargs': {'endpoint_url': 'http://h:1'},
               'config_kwargs': {'retries': {'max_attempts': 2}}}
    native_s3_options(options, {})
    assert options == {'key': 'K', 'secret': 'S', 'client_kwargs': {'endpoint_url': 'http://h:1'},
                       'config_kwargs': {'retries': {'max_attempts': 2}}}
