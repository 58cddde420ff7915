"""petastorm.fs: storage errors told with the URL and without secrets, and retries of transient ones.

Everything here runs without a server: ``memory://`` and fsspec filesystems made in the test (see
:mod:`support.fake_storage`) stand in for remote storage.
"""

from __future__ import annotations

import os
import pickle
import socket
from urllib.parse import urlparse

import pyarrow.fs as pafs
import pytest

from petastorm import make_reader
from petastorm.errors import StorageCredentialsError, StorageError, StorageNotFoundError, StoragePermissionError
from petastorm.fs import RetryPolicy, StorageHandler, resolve_url
from petastorm.fs._errors import classify, is_transient, redact, secrets_of
from petastorm.fs._resolve import check_endpoint_listens
from support.fake_storage import SECRET, ClientError, assert_secret_hidden, fake_store


def test_missing_dataset_is_file_not_found_naming_the_url(memory_url):
    with pytest.raises(FileNotFoundError, match=memory_url):
        make_reader(memory_url)
    fs, path = resolve_url(memory_url)
    with pytest.raises(StorageNotFoundError, match=f'{memory_url}/nope.parquet does not exist'):
        fs.open_input_file(path + '/nope.parquet')


@pytest.mark.parametrize(('error', 'expected', 'words'), [
    (PermissionError(f'Forbidden (token {SECRET})'), StoragePermissionError, 'permission denied'),
    (ClientError('AccessDenied', 403, 'Access Denied'), StoragePermissionError, 'permission denied'),
    (ClientError('InvalidAccessKeyId', 403, 'The AWS Access Key Id you provided does not exist'),
     StorageCredentialsError, 'refused the credentials'),
    (ClientError('SignatureDoesNotMatch', 403, f'bad signature for {SECRET}'), StorageCredentialsError,
     'refused the credentials'),
    (type('NoCredentialsError', (Exception,), {})('Unable to locate credentials'), StorageCredentialsError,
     r'^no credentials were found for .*Pass them in storage_options'),
    (ClientError('NoSuchBucket', 404, 'The specified bucket does not exist'), StorageNotFoundError, 'does not exist'),
])
def test_storage_errors_are_translated_with_the_url_and_no_secret(memory_url, error, expected, words):
    fs = fake_store(info_error=error, secret=SECRET)
    with pytest.raises(expected, match=words) as raised:
        make_reader(memory_url, filesystem=fs, storage_options={'secret': SECRET})
    assert memory_url in str(raised.value)
    if SECRET not in str(error):
        assert raised.value.__cause__ is error
    assert_secret_hidden(raised.value)


def test_classify_reads_codes_statuses_types_and_messages():
    assert classify(FileNotFoundError('x')) == 'not_found'
    assert classify(ClientError('ExpiredToken', 400)) == 'credentials'
    assert classify(ClientError('SlowDown', 503)) == 'transient'
    assert classify(ClientError('Weird', 500)) == 'transient'
    assert classify(ValueError('bad')) == 'other'
    wrapped = OSError('We encountered an internal error')
    wrapped.__cause__ = ClientError('InternalError', 500)
    assert classify(wrapped) == 'transient'
    assert is_transient(ConnectionResetError('reset'))
    assert is_transient(TimeoutError())
    assert is_transient(type('ClientPayloadError', (Exception,), {})('Response payload is not completed'))
    assert not is_transient(PermissionError('Throttling of permissions'))
    assert not is_transient(FileNotFoundError('timed out'))


def test_redact_hides_secrets_and_url_passwords():
    options = {'key': 'AKIA1234', 'secret': SECRET, 'client_kwargs': {'aws_session_token': 'tok-9876'},
               'endpoint_url': 'http://127.0.0.1:9000', 'anon': False}
    assert set(secrets_of(options)) == {'AKIA1234', SECRET, 'tok-9876'}
    text = f'failed with {SECRET} and tok-9876 at ftp://alice:pa55word@host/x and http://127.0.0.1:9000'
    assert redact(text, secrets_of(options)) == ('failed with *** and *** at ftp://alice:***@host/x and '
                                                 'http://127.0.0.1:9000')


def test_transient_read_errors_are_retried_and_every_row_arrives_once(memory_dataset, monkeypatch):
    monkeypatch.setattr(StorageHandler, '__init__', _fast_retry_init(StorageHandler.__init__))
    flaky = [ConnectionResetError('Connection reset by peer'), TimeoutError('read timed out'),
             ClientError('SlowDown', 503, 'Please reduce your request rate.'), None,
             ClientError('InternalError', 500, 'We encountered an internal error.'), None]
    fs = fake_store(cat_errors=flaky)
    with make_reader(memory_dataset, filesystem=fs, reader_pool_type='dummy') as reader:
        ids = sorted(row.id for row in reader)
    assert ids == list(range(200))
    assert fs.cat_errors == []  # the reads met every failure above and got past it


def _fast_retry_init(original):
    def init(self, fs, scheme, retry=None):
        original(self, fs, scheme, RetryPolicy(attempts=4, base_delay=0.001, max_delay=0.002))
    return init


def test_non_transient_errors_are_not_retried(memory_dataset):
    fs = fake_store(cat_errors=[ValueError('corrupt'), None])
    handler = StorageHandler(fs, 'memory', RetryPolicy(attempts=5, base_delay=0))
    path = urlparse(memory_dataset).path + '/_common_metadata'
    with pytest.raises(StorageError, match='corrupt'):
        pafs.PyFileSystem(handler).open_input_file(path).read()
    assert fs.cat_errors == [None]  # one call, not five


def test_exhausted_retries_say_how_many_attempts_were_made(memory_dataset):
    fs = fake_store(cat_errors=[TimeoutError('timed out')] * 3)
    handler = StorageHandler(fs, 'memory', RetryPolicy(attempts=3, base_delay=0))
    path = urlparse(memory_dataset).path + '/_common_metadata'
    with pytest.raises(StorageError, match=r'memory://.*_common_metadata still failed after 3 attempts'):
        pafs.PyFileSystem(handler).open_input_file(path).read()


def test_retry_policy_validates_and_caps_delays():
    with pytest.raises(ValueError, match='attempts'):
        RetryPolicy(attempts=0)
    policy = RetryPolicy(base_delay=1.0, max_delay=3.0)
    assert 0.5 <= policy.delay(1) <= 1.0
    assert 1.5 <= policy.delay(10) <= 3.0
    assert pickle.loads(pickle.dumps(policy)) == policy


def test_a_refused_connection_is_reported_at_once_not_retried():
    from petastorm.fs._errors import classify, is_transient, translate

    refused = OSError('Could not connect to the endpoint URL')
    refused.__cause__ = ConnectionRefusedError(111, 'Connection refused')
    assert classify(refused) == 'refused'
    assert not is_transient(refused)
    assert is_transient(ConnectionResetError(104, 'Connection reset by peer'))
    error = translate(refused, 'listing', 's3://bucket/data', attempts=1)
    assert 'listing on s3://bucket/data failed: the storage endpoint refused the connection' in str(error)
    attempts = []

    def call():
        attempts.append(1)
        raise refused

    with pytest.raises(OSError, match='Could not connect'):
        RetryPolicy(attempts=3, base_delay=0).call(call, 'listing s3://bucket/data')
    assert len(attempts) == 1


def test_each_retry_is_logged_as_a_warning_with_the_url_and_without_secrets(caplog):
    failures = [ConnectionResetError(104, f'reset while sending {SECRET}'), TimeoutError('timed out')]

    def call():
        if failures:
            raise failures.pop(0)
        return 'ok'

    with caplog.at_level('WARNING', logger='petastorm.fs'):
        assert RetryPolicy(attempts=3, base_delay=0).call(call, 'reading s3://bucket/data/part-0', [SECRET]) == 'ok'
    warnings_logged = [r for r in caplog.records if r.levelname == 'WARNING']
    assert len(warnings_logged) == 2
    assert all('reading s3://bucket/data/part-0 failed with a transient error' in r.getMessage()
               for r in warnings_logged)
    assert SECRET not in caplog.text


def test_resolving_an_s3_url_refuses_an_endpoint_that_refuses_connections():
    pytest.importorskip('s3fs')
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    with pytest.raises(StorageError, match=rf'cannot reach s3://bucket/data: the S3 endpoint http://127.0.0.1:{port} '
                                           rf'refused the connection \(nothing listens at 127.0.0.1:{port}\)'):
        resolve_url('s3://bucket/data', {'key': 'k', 'secret': SECRET, 'endpoint_url': f'http://127.0.0.1:{port}'})


def test_an_endpoint_reached_through_a_proxy_of_the_environment_is_not_checked(monkeypatch):
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        port = sock.getsockname()[1]
    endpoint = f'http://127.0.0.1:{port}'
    for name in [name for name in os.environ if name.lower() in ('http_proxy', 'no_proxy')]:
        monkeypatch.delenv(name)
    with pytest.raises(StorageError, match='refused the connection'):
        check_endpoint_listens(endpoint, 's3://bucket/data')
    monkeypatch.setenv('HTTP_PROXY', 'http://proxy.invalid:3128')
    check_endpoint_listens(endpoint, 's3://bucket/data')  # the proxy is what the client connects to
    monkeypatch.setenv('NO_PROXY', '127.0.0.1')
    with pytest.raises(StorageError, match='refused the connection'):
        check_endpoint_listens(endpoint, 's3://bucket/data')


@pytest.mark.parametrize(('operation', 'phrase', 'bare'), [
    ('listing', 'listing on s3://bucket/data', 'listing'),
    ('opening the dataset at', 'opening the dataset at s3://bucket/data', 'opening the dataset'),
    ('reading row group 3 of', 'reading row group 3 of s3://bucket/data', 'reading row group 3'),
    ('reading the Parquet footer of', 'reading the Parquet footer of s3://bucket/data', 'reading the Parquet footer'),
])
def test_messages_join_an_operation_and_its_url_once(operation, phrase, bare):
    from petastorm.fs._errors import translate

    transient = translate(TimeoutError('timed out'), operation, 's3://bucket/data', attempts=3)
    assert f'{phrase} still failed after 3 attempts' in str(transient)
    gone = translate(FileNotFoundError(2, 'No such file'), operation, 's3://bucket/data')
    assert f's3://bucket/data does not exist ({bare}: ' in str(gone)
