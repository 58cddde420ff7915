"""GCS's and Azure's ``storage_options``, read once by the shared parser: refused by name before any request when no
client takes them, translated to pyarrow's own clients whenever every option has a meaning there (else gcsfs and
adlfs), and to delta-rs's and pyiceberg's names; credentials found where each cloud's own tools look, and a clear
error naming those places when they are nowhere.
"""

from __future__ import annotations

import pytest

from petastorm.errors import StorageCredentialsError, StorageOptionsError
from petastorm.fs import resolve_url
from petastorm.fs.settings import delta_storage_options, fsspec_options, iceberg_io_properties
from petastorm.fs.settings.azure import (
    DEVELOPMENT_ACCOUNT,
    DEVELOPMENT_KEY,
    find_credentials,
    pyarrow_azure_arguments,
    read_azure_settings,
)
from petastorm.fs.settings.gcs import pyarrow_gcs_arguments, read_gcs_settings

GS = 'gs://bucket/ds'
AZ = 'abfs://container/ds'
EMULATOR = 'http://127.0.0.1:4443'
KEY = 'c2VjcmV0LWtleS1uZXZlci1zaG93bi0wMTIzNDU2Nzg5'
AZURITE = (f'DefaultEndpointsProtocol=http;AccountName={DEVELOPMENT_ACCOUNT};AccountKey={DEVELOPMENT_KEY};'
           f'BlobEndpoint=http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT};')


@pytest.mark.parametrize(('url', 'options', 'bad', 'closest'), [
    (GS, {'endpoint_url': EMULATOR, 'tokn': 'anon'}, 'tokn', 'token'),
    (GS, {'projekt': 'p'}, 'projekt', 'project'),
    ('gcs://bucket/ds', {'requester_pay': True}, 'requester_pay', 'requester_pays'),
    (AZ, {'account_nam': 'acc'}, 'account_nam', 'account_name'),
    ('az://container/ds', {'conection_string': AZURITE}, 'conection_string', 'connection_string'),
    ('abfss://container/ds', {'sas_tokn': 'sv=1'}, 'sas_tokn', 'sas_token'),
])
def test_an_unknown_key_is_refused_before_any_request_with_the_closest_name(url, options, bad, closest):
    with pytest.raises(StorageOptionsError, match=rf"'{bad}'.*did you mean '{closest}'") as raised:
        resolve_url(url, options)
    assert KEY not in str(raised.value)


@pytest.mark.parametrize(('url', 'options', 'instead'), [
    (GS, {'endpoint_override': '127.0.0.1:4443'}, 'endpoint_url'),
    (GS, {'anonymous': True}, "'token': 'anon'"),
    (AZ, {'blob_storage_authority': '127.0.0.1:10000'}, 'connection_string'),
])
def test_pyarrow_s_names_are_refused_with_the_name_to_write(url, options, instead):
    with pytest.raises(StorageOptionsError, match=f"pyarrow's name.*{instead}"):
        resolve_url(url, options)


def test_gcs_options_translate_to_pyarrow_s_client():
    arguments = pyarrow_gcs_arguments(read_gcs_settings({'endpoint_url': EMULATOR, 'token': 'anon',
                                                         'project_id': 'p', 'default_location': 'EU',
                                                         'cache_timeout': 5}), {})
    assert arguments is not None
    assert (arguments['scheme'], arguments['endpoint_override'], arguments['anonymous']) == \
        ('http', '127.0.0.1:4443', True)
    assert (arguments['project_id'], arguments['default_bucket_location']) == ('p', 'EU')
    emulator_host = pyarrow_gcs_arguments(read_gcs_settings({}), {'STORAGE_EMULATOR_HOST': '127.0.0.1:4443'})
    assert emulator_host is not None
    assert emulator_host['endpoint_override'] == '127.0.0.1:4443'


@pytest.mark.parametrize('options', [
    {'token': '/keys/service-account.json'}, {'requester_pays': True}, {'version_aware': True},
    {'session_kwargs': {'trust_env': True}}, {'requests_timeout': 30}, {'endpoint_url': 'http://host:1/prefix'},
])
def test_gcs_options_pyarrow_cannot_take_stay_with_gcsfs(options):
    assert pyarrow_gcs_arguments(read_gcs_settings(options), {'STORAGE_EMULATOR_HOST': EMULATOR}) is None
    assert fsspec_options('gs', GS, options) == options


def test_gcs_options_for_the_table_libraries():
    options = {'endpoint_url': EMULATOR, 'project': 'p', 'token': 'anon', 'gcs.oauth2.token': 't',
               'google_service_account': '/k.json'}
    # pyiceberg's pyarrow file IO has no anonymous access: its gcsfs one is named
    assert iceberg_io_properties(GS, options) == {'gcs.service.host': EMULATOR, 'gcs.project-id': 'p',
                                                  'gcs.token': 'anon', 'gcs.oauth2.token': 't',
                                                  'py-io-impl': 'pyiceberg.io.fsspec.FsspecFileIO'}
    assert 'py-io-impl' not in iceberg_io_properties(GS, {'endpoint_url': EMULATOR})
    # delta-rs's GCS client: the endpoint as its base URL, anonymous access as unsigned requests
    assert delta_storage_options(GS, options) == {'google_base_url': EMULATOR, 'google_skip_signature': 'true',
                                                  'google_service_account': '/k.json'}
    assert delta_storage_options(GS, {'token': '/keys/sa.json'}) == {'google_service_account': '/keys/sa.json'}


def test_gcs_delta_options_reach_an_emulator_anonymously_as_the_other_clients_do(monkeypatch, tmp_path):
    from petastorm.fs.settings import gcs

    monkeypatch.delenv('GOOGLE_APPLICATION_CREDENTIALS', raising=False)
    monkeypatch.setenv('CLOUDSDK_CONFIG', str(tmp_path))  # no application default credentials
    monkeypatch.setenv('STORAGE_EMULATOR_HOST', '127.0.0.1:4443')
    assert delta_storage_options(GS, {}) == {'google_base_url': 'http://127.0.0.1:4443',
                                             'google_skip_signature': 'true'}
    # with default credentials to be found, delta-rs finds them too; on Google's endpoint nothing is added
    (tmp_path / 'application_default_credentials.json').write_text('{}')
    assert delta_storage_options(GS, {}) == {'google_base_url': 'http://127.0.0.1:4443'}
    monkeypatch.delenv('STORAGE_EMULATOR_HOST')
    assert delta_storage_options(GS, {}) == {}
    assert delta_storage_options(GS, {'token': 'anon'}) == {'google_skip_signature': 'true'}
    # one rule for every client: pyarrow's client is anonymous exactly when delta-rs's is
    settings = gcs.read_gcs_settings({'endpoint_url': EMULATOR})
    assert gcs.reads_anonymously(settings, {}) == (gcs.pyarrow_gcs_arguments(settings, {}) or {}).get('anonymous',
                                                                                                   False)


def test_azure_connection_string_gives_the_account_key_and_endpoint():
    arguments = pyarrow_azure_arguments(read_azure_settings({'connection_string': AZURITE}), {})
    assert arguments == {'account_name': DEVELOPMENT_ACCOUNT, 'account_key': DEVELOPMENT_KEY,
                         'blob_storage_authority': '127.0.0.1:10000', 'dfs_storage_authority': '127.0.0.1:10000',
                         'blob_storage_scheme': 'http', 'dfs_storage_scheme': 'http'}
    development = pyarrow_azure_arguments(read_azure_settings({'connection_string': 'UseDevelopmentStorage=true'}),
                                          {})
    assert development == arguments
    public = pyarrow_azure_arguments(read_azure_settings({'connection_string': (
        f'DefaultEndpointsProtocol=https;AccountName=acc;AccountKey={KEY};EndpointSuffix=core.windows.net')}), {})
    assert public == {'account_name': 'acc', 'account_key': KEY, 'blob_storage_authority': '.blob.core.windows.net',
                      'dfs_storage_authority': '.dfs.core.windows.net', 'blob_storage_scheme': 'https',
                      'dfs_storage_scheme': 'https'}


def test_azure_credentials_come_from_the_environment_as_azure_s_tools_read_them():
    environ = {'AZURE_STORAGE_ACCOUNT_NAME': 'acc', 'AZURE_STORAGE_SAS_TOKEN': '?sv=2024&sig=abc'}
    assert pyarrow_azure_arguments(read_azure_settings({}), environ) == {'account_name': 'acc',
                                                                        'sas_token': 'sv=2024&sig=abc'}
    from_string = find_credentials(read_azure_settings({}), {'AZURE_STORAGE_CONNECTION_STRING': AZURITE})
    assert (from_string.account_name, from_string.account_key) == (DEVELOPMENT_ACCOUNT, DEVELOPMENT_KEY)
    # The options come first; the account may be in the URL.
    named = find_credentials(read_azure_settings({'account_key': KEY}, 'abfs://c@acc.dfs.core.windows.net/d'),
                             {'AZURE_STORAGE_ACCOUNT_KEY': 'other'})
    assert (named.account_name, named.account_key) == ('acc', KEY)
    service_principal = pyarrow_azure_arguments(read_azure_settings(
        {'account_name': 'acc', 'client_id': 'i', 'client_secret': 's', 'tenant_id': 't'}), {})
    assert service_principal == {'account_name': 'acc', 'client_id': 'i', 'client_secret': 's', 'tenant_id': 't'}


@pytest.mark.parametrize('options', [{'account_name': 'a', 'anon': True}, {'account_name': 'a', 'credential': object()},
                                     {'account_name': 'a', 'location_mode': 'secondary'},
                                     {'account_name': 'a', 'version_aware': True}])
def test_azure_options_pyarrow_cannot_take_stay_with_adlfs(options):
    assert pyarrow_azure_arguments(read_azure_settings(options), {}) is None


def test_azure_options_for_the_table_libraries():
    delta = delta_storage_options(AZ, {'connection_string': AZURITE})
    assert delta == {'azure_storage_account_name': DEVELOPMENT_ACCOUNT, 'azure_storage_account_key': DEVELOPMENT_KEY,
                     'azure_storage_endpoint': f'http://127.0.0.1:10000/{DEVELOPMENT_ACCOUNT}',
                     'allow_http': 'true'}
    iceberg = iceberg_io_properties(AZ, {'account_name': 'acc', 'sas_token': 'sv=1', 'adls.timeout': '5'})
    assert iceberg == {'adls.account-name': 'acc', 'adls.sas-token': 'sv=1', 'adls.timeout': '5'}


def test_no_google_credentials_is_an_error_naming_where_they_were_looked_for(monkeypatch, tmp_path):
    for name in ('GOOGLE_APPLICATION_CREDENTIALS', 'STORAGE_EMULATOR_HOST', 'GCE_METADATA_HOST', 'K_SERVICE'):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv('CLOUDSDK_CONFIG', str(tmp_path))
    from petastorm.fs.settings import gcs

    monkeypatch.setattr(gcs, '_on_google_machine', lambda environ: False)
    with pytest.raises(StorageCredentialsError, match='GOOGLE_APPLICATION_CREDENTIALS.*application-default.*'
                                                      "metadata server.*'token': 'anon'") as raised:
        resolve_url(GS)
    assert 'gs://bucket/ds' in str(raised.value)
    (tmp_path / 'application_default_credentials.json').write_text('{}')
    assert gcs.missing_credentials(read_gcs_settings({}), {'CLOUDSDK_CONFIG': str(tmp_path)}) is None


def test_no_azure_account_is_an_error_naming_where_it_was_looked_for(monkeypatch):
    for name in ('AZURE_STORAGE_ACCOUNT_NAME', 'AZURE_STORAGE_CONNECTION_STRING'):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(StorageCredentialsError, match='account_name.*connection_string.*AZURE_STORAGE_CONNECTION_'
                                                      'STRING.*AZURE_STORAGE_ACCOUNT_NAME') as raised:
        resolve_url(AZ, {'account_key': KEY})
    assert KEY not in str(raised.value)
    assert 'abfs://container/ds' in str(raised.value)


@pytest.mark.parametrize(('url', 'options', 'endpoint', 'option'), [
    (GS, {'endpoint_url': 'http://127.0.0.1:9', 'token': 'anon'}, 'GCS endpoint', 'endpoint_url'),
    (AZ, {'connection_string': AZURITE.replace(':10000', ':9')}, 'Azure Blob endpoint', 'connection_string'),
])
def test_a_refused_emulator_endpoint_fails_at_once_naming_the_option(url, options, endpoint, option):
    from petastorm.errors import StorageError
    from petastorm.fs._native_clouds import has_native_azure

    if url == AZ and not has_native_azure():
        pytest.importorskip('adlfs', reason='neither pyarrow (before 16) nor adlfs has an Azure client here')
    with pytest.raises(StorageError, match=f'{endpoint}.*refused.*{option}'):
        resolve_url(url, options)
