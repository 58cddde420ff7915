"""petastorm.fs.hadoop: HDFS namenodes from URLs and the Hadoop configuration, the client's connection, and
Petastorm's HA client that fails over between namenodes.

No cluster is needed: the configuration is Hadoop XML written to a temporary ``$HADOOP_HOME``, and connections
go to local filesystems (:mod:`support.fake_storage`).
"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

import petastorm.fs.hadoop as hadoop
from petastorm.errors import StorageError
from petastorm.fs import resolve_url
from petastorm.hdfs.namenode import HAHdfsClient, HdfsConnectError, HdfsNamenodeResolver, MaxFailoversExceeded
from support.fake_storage import HA_SITE, site_xml


@pytest.fixture
def connections(monkeypatch):
    """Record what ``connect_hadoop`` is asked to connect to, and hand out local filesystems instead."""
    calls = []

    def connect(host, port, user=None, **options):
        calls.append({'host': host, 'port': port, 'user': user, **options})
        return pafs.LocalFileSystem()

    monkeypatch.setattr(hadoop, 'connect_hadoop', connect)
    return calls


def test_namenode_resolver_reads_the_xml_under_hadoop_home(hadoop_home):
    resolver = HdfsNamenodeResolver()
    assert resolver.resolve_hdfs_name_service('ns1') == ['nn1.example.com:8020', 'nn2.example.com:8020']
    assert resolver.resolve_hdfs_name_service('other') is None
    assert resolver.resolve_default_hdfs_service() == ('ns1', ['nn1.example.com:8020', 'nn2.example.com:8020'])


def test_hadoop_conf_dir_wins_and_hadoop_prefix_is_a_fallback(hadoop_home, tmp_path, monkeypatch):
    other = tmp_path / 'conf'
    other.mkdir()
    (other / 'core-site.xml').write_text(site_xml({'fs.defaultFS': 'hdfs://single-host:9000'}))
    monkeypatch.setenv('HADOOP_CONF_DIR', str(other))
    assert HdfsNamenodeResolver().resolve_default_hdfs_service() == ('single-host:9000', ['single-host:9000'])
    monkeypatch.delenv('HADOOP_CONF_DIR')
    monkeypatch.delenv('HADOOP_HOME')
    monkeypatch.setenv('HADOOP_PREFIX', str(hadoop_home.parent.parent))
    assert HdfsNamenodeResolver().resolve_hdfs_name_service('ns1') is not None


def test_missing_default_fs_is_a_runtime_error(monkeypatch):
    for variable in hadoop.HADOOP_ENV_VARS:
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(RuntimeError, match='fs.defaultFS is not set'):
        HdfsNamenodeResolver().resolve_default_hdfs_service()
    with pytest.raises(RuntimeError, match='fs.defaultFS'):
        resolve_url('hdfs:///data')
    assert HdfsNamenodeResolver({'fs.defaultFS': 'hdfs://h:1'}).resolve_default_hdfs_service() == ('h:1', ['h:1'])


def test_malformed_hadoop_xml_names_the_file(tmp_path, monkeypatch):
    (tmp_path / 'core-site.xml').write_text('<configuration><property>')
    monkeypatch.setenv('HADOOP_CONF_DIR', str(tmp_path))
    with pytest.raises(ValueError, match='core-site.xml is not a valid Hadoop configuration file'):
        HdfsNamenodeResolver()


@pytest.mark.parametrize(('url', 'host', 'port', 'user', 'path'), [
    ('hdfs://namenode:9000/data/set', 'namenode', 9000, None, '/data/set'),
    ('hdfs://plainhost/data', 'plainhost', 8020, None, '/data'),
    ('hdfs://alice@namenode:9000/data', 'namenode', 9000, 'alice', '/data'),
    ('hdfs://ns1/data', 'ns1', 0, None, '/data'),
    ('hdfs:///data', 'ns1', 0, None, '/data'),
])
def test_hdfs_urls_connect_to_the_right_namenode(hadoop_home, connections, url, host, port, user, path):
    fs, resolved = resolve_url(url)
    assert resolved == path
    assert isinstance(fs, pafs.LocalFileSystem)
    [call] = connections
    assert (call['host'], call['port'], call['user']) == (host, port, user)
    if port == 0:  # an HA nameservice: the client gets its namenodes and fails over itself
        assert call['extra_conf'] == {
            'dfs.nameservices': 'ns1',
            'dfs.ha.namenodes.ns1': 'nn1,nn2',
            'dfs.client.failover.proxy.provider.ns1':
                'org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider',
            'dfs.namenode.rpc-address.ns1.nn1': 'nn1.example.com:8020',
            'dfs.namenode.rpc-address.ns1.nn2': 'nn2.example.com:8020',
        }
    else:
        assert 'extra_conf' not in call


def test_hdfs_storage_options_and_configuration_reach_the_client(connections):
    resolve_url('hdfs://ns9/x', {'user': 'bob', 'kerb_ticket': '/tmp/krb5cc', 'extra_conf': {'a': 'b'}},
                hadoop_configuration={**{k.replace('ns1', 'ns9'): v for k, v in HA_SITE.items()}})
    [call] = connections
    assert call['host'] == 'ns9'
    assert call['user'] == 'bob'
    assert call['kerb_ticket'] == '/tmp/krb5cc'
    assert call['extra_conf']['a'] == 'b'
    assert call['extra_conf']['dfs.ha.namenodes.ns9'] == 'nn1,nn2'


def test_hdfs_driver_is_accepted_and_checked(connections):
    resolve_url('hdfs://h:1/x', hdfs_driver='libhdfs')
    resolve_url('hdfs://h:1/x', hdfs_driver='libhdfs3')
    with pytest.raises(ValueError, match="hdfs_driver must be 'libhdfs3' or 'libhdfs'"):
        resolve_url('hdfs://h:1/x', hdfs_driver='webhdfs')


def test_hdfs_connection_failure_says_what_the_client_needs(monkeypatch):
    def refuse(host, port, user=None, **options):
        raise OSError('Unable to load libhdfs: libhdfs.so: cannot open shared object file')

    monkeypatch.setattr(hadoop, 'connect_hadoop', refuse)
    with pytest.raises(StorageError, match=r'cannot connect to HDFS namenode:9000 for hdfs://namenode:9000/x.*'
                                           r'CLASSPATH'):
        resolve_url('hdfs://namenode:9000/x')


def test_ha_client_fails_over_to_the_next_namenode(stub_connector, tmp_path):
    stub_connector.broken = {'nn1:8020'}
    fs = stub_connector.connect_to_either_namenode(['nn1:8020', 'nn2:8020'])
    assert fs.get_file_info(str(tmp_path)).type == pafs.FileType.Directory
    assert stub_connector.connected == ['nn1:8020', 'nn2:8020']
    assert fs.handler.namenode == 'nn2:8020'
    with pytest.raises(FileNotFoundError):  # about the path, not the namenode: no failover
        fs.open_input_file(str(tmp_path / 'missing'))
    assert fs.handler.namenode == 'nn2:8020'


def test_ha_client_gives_up_after_max_failovers(stub_connector, tmp_path):
    stub_connector.broken = {'nn1:8020', 'nn2:8020'}
    fs = stub_connector.connect_to_either_namenode(['nn1:8020', 'nn2:8020'])
    with pytest.raises(MaxFailoversExceeded, match=r'maximum \(3\) for action "get_file_info"') as raised:
        fs.get_file_info(str(tmp_path))
    assert len(raised.value.failed_exceptions) == 4
    stub_connector.down = {'a:1', 'b:2'}
    with pytest.raises(HdfsConnectError, match='Unable to connect'):
        HAHdfsClient(stub_connector, ['a:1', 'b:2'])
