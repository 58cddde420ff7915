"""HDFS: namenodes from ``hdfs://`` URLs and the Hadoop configuration, connections through ``pyarrow.fs``.

How an ``hdfs://`` URL is resolved (as Petastorm users expect):

* ``hdfs://host:port/path``: that namenode.
* ``hdfs://name/path`` without a port: if ``name`` is an HA nameservice of the Hadoop configuration
  (``dfs.ha.namenodes.<name>`` and ``dfs.namenode.rpc-address.<name>.<nn>``), the nameservice, with its
  namenodes passed to the Hadoop client so that it fails over between them; otherwise host ``name``, port 8020.
* ``hdfs:///path``: the default filesystem, ``fs.defaultFS`` of the configuration (a ``RuntimeError`` when it is
  not set), then as above.

The configuration is the ``hadoop_configuration`` given (a dict, or any object with ``get(key)`` such as Spark's
``sc._jsc.hadoopConfiguration()``), else ``core-site.xml`` and ``hdfs-site.xml`` of the first of
``$HADOOP_CONF_DIR``, ``$HADOOP_HOME/etc/hadoop``, ``$HADOOP_PREFIX/etc/hadoop`` and
``$HADOOP_INSTALL/etc/hadoop`` that holds them.

The client is ``pyarrow.fs.HadoopFileSystem``, which uses Hadoop's JNI ``libhdfs``. It needs a Java runtime,
``libhdfs.so`` (found through ``$ARROW_LIBHDFS_DIR`` or ``$HADOOP_HOME/lib/native``) and the Hadoop jars on the
class path (``export CLASSPATH=$(hadoop classpath --glob)``). Petastorm's ``hdfs_driver`` argument is accepted:
``'libhdfs3'`` (its default) and ``'libhdfs'`` both use this client, because pyarrow dropped libhdfs3.
``storage_options`` for ``hdfs://`` are keyword arguments of ``HadoopFileSystem`` (``user``, ``kerb_ticket``,
``extra_conf``, ``replication``, ``buffer_size``, ``default_block_size``).

This module also keeps Petastorm's ``petastorm.hdfs.namenode`` API (:class:`HdfsNamenodeResolver`,
:class:`HdfsConnector`, :class:`HAHdfsClient`, :class:`namenode_failover`...), re-exported there.
"""

from __future__ import annotations

import functools
import logging
import os
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import ParseResult, urlparse

import pyarrow.fs as pafs

from petastorm.errors import PetastormError, StorageError

__all__ = [
    'DEFAULT_NAMENODE_PORT',
    'HADOOP_ENV_VARS',
    'HDFS_DRIVERS',
    'HAHdfsClient',
    'HdfsConnectError',
    'HdfsConnector',
    'HdfsNamenodeResolver',
    'MaxFailoversExceeded',
    'NamenodeTarget',
    'check_hdfs_driver',
    'connect_hadoop',
    'failover_all_class_methods',
    'hadoop_config_dir',
    'hdfs_filesystem',
    'load_hadoop_configuration',
    'namenode_failover',
    'namenode_target',
    'read_hadoop_xml',
]

logger = logging.getLogger(__name__)

DEFAULT_NAMENODE_PORT = 8020
HDFS_DRIVERS = ('libhdfs3', 'libhdfs')
#: where the Hadoop configuration is looked for, in this order (``HADOOP_CONF_DIR`` is the directory itself).
HADOOP_ENV_VARS = ('HADOOP_CONF_DIR', 'HADOOP_HOME', 'HADOOP_PREFIX', 'HADOOP_INSTALL')
_CONFIG_FILES = ('core-site.xml', 'hdfs-site.xml')
_FAILOVER_PROVIDER = 'org.apache.hadoop.hdfs.server.namenode.ha.ConfiguredFailoverProxyProvider'


class HdfsConnectError(PetastormError, OSError):
    """No namenode of a list could be connected to."""


class MaxFailoversExceeded(PetastormError, RuntimeError):
    """An HDFS call kept failing after failing over between namenodes the maximum number of times."""

    def __init__(self, failed_exceptions: list[BaseException], max_failover_attempts: int, func_name: str) -> None:
        self.failed_exceptions = failed_exceptions
        self.max_failover_attempts = max_failover_attempts
        self.func_name = func_name
        listed = '\n'.join(f'  {type(e).__name__}: {e}' for e in failed_exceptions)
        super().__init__(f'Failover attempts exceeded maximum ({max_failover_attempts}) for action "{func_name}". '
                         f'Exceptions:\n{listed}')


# -- configuration ------------------------------------------------------------------------------------------------

def hadoop_config_dir() -> str | None:
    """The first Hadoop configuration directory named by the environment that holds a ``*-site.xml``."""
    for variable in HADOOP_ENV_VARS:
        value = os.environ.get(variable)
        if not value:
            continue
        directory = value if variable == 'HADOOP_CONF_DIR' else os.path.join(value, 'etc', 'hadoop')
        if any(os.path.isfile(os.path.join(directory, name)) for name in _CONFIG_FILES):
            return directory
    return None


def read_hadoop_xml(path: str) -> dict[str, str]:
    """``name -> value`` of the ``<property>`` entries of one Hadoop XML configuration file.

    Raises:
        ValueError: the file is not well-formed XML.
    """
    try:
        root = ET.parse(path).getroot()
    except ET.ParseError as err:
        raise ValueError(f'{path} is not a valid Hadoop configuration file: {err}') from err
    properties = {}
    for prop in root.iter('property'):
        name = (prop.findtext('name') or '').strip()
        if name:
            properties[name] = (prop.findtext('value') or '').strip()
    return properties


def load_hadoop_configuration() -> dict[str, str]:
    """The Hadoop configuration found through the environment (``core-site.xml`` then ``hdfs-site.xml``)."""
    directory = hadoop_config_dir()
    if directory is None:
        logger.debug('no Hadoop configuration found through %s', ', '.join(HADOOP_ENV_VARS))
        return {}
    configuration: dict[str, str] = {}
    for name in _CONFIG_FILES:
        path = os.path.join(directory, name)
        if os.path.isfile(path):
            configuration.update(read_hadoop_xml(path))
    return configuration


def _split_host_port(netloc: str) -> tuple[str, int | None]:
    hostport = netloc.rpartition('@')[2]
    host, _, port = hostport.partition(':')
    if port and not port.isdigit():
        raise ValueError(f'HDFS address {netloc!r} has an invalid port {port!r}')
    return host, int(port) if port else None


class HdfsNamenodeResolver:
    """Namenodes of HDFS nameservices, from a Hadoop configuration.

    Args:
        hadoop_configuration: a dict of Hadoop properties, or an object with ``get(key)`` (Spark's
            ``sc._jsc.hadoopConfiguration()``). Default: the XML files found through the environment.
    """

    def __init__(self, hadoop_configuration: Any = None) -> None:
        self._hadoop_configuration = (load_hadoop_configuration() if hadoop_configuration is None
                                      else hadoop_configuration)

    def _get(self, key: str) -> str | None:
        value = self._hadoop_configuration.get(key)
        return None if value is None else str(value).strip()

    def resolve_hdfs_name_service(self, namespace: str) -> list[str] | None:
        """``['host:port', ...]`` of the namenodes of HA nameservice ``namespace``, or None if it is not one."""
        listed = self._get(f'dfs.ha.namenodes.{namespace}')
        if not listed:
            return None
        namenodes = []
        for namenode in (n.strip() for n in listed.split(',')):
            address = self._get(f'dfs.namenode.rpc-address.{namespace}.{namenode}')
            if not address:
                raise RuntimeError(f'the Hadoop configuration lists namenode {namenode!r} of nameservice '
                                   f'{namespace!r} but has no dfs.namenode.rpc-address.{namespace}.{namenode}')
            namenodes.append(address)
        return namenodes

    def resolve_default_hdfs_service(self) -> tuple[str, list[str]]:
        """The default filesystem's nameservice (or ``host[:port]``) and its namenodes.

        Raises:
            RuntimeError: ``fs.defaultFS`` is not set (nor the older ``fs.default.name``).
        """
        default_fs = self._get('fs.defaultFS') or self._get('fs.default.name')
        if not default_fs:
            raise RuntimeError(
                'Failed to resolve the default HDFS service: fs.defaultFS is not set in the Hadoop configuration '
                f'(looked in the configuration given, else in core-site.xml under ${", $".join(HADOOP_ENV_VARS)}). '
                'Name the namenode in the URL (hdfs://host:port/path) or set HADOOP_CONF_DIR.')
        parsed = urlparse(default_fs)
        if parsed.scheme not in ('hdfs', 'viewfs') or not parsed.netloc:
            raise RuntimeError(f'fs.defaultFS is {default_fs!r}, not an hdfs://nameservice URL')
        nameservice = parsed.netloc
        namenodes = self.resolve_hdfs_name_service(nameservice)
        if namenodes is None:
            host, port = _split_host_port(nameservice)
            namenodes = [f'{host}:{port or DEFAULT_NAMENODE_PORT}']
        return nameservice, namenodes

    def ha_configuration(self, nameservice: str) -> dict[str, str]:
        """The Hadoop properties a client needs to fail over between the namenodes of ``nameservice``."""
        listed = self._get(f'dfs.ha.namenodes.{nameservice}') or ''
        names = [n.strip() for n in listed.split(',') if n.strip()]
        configuration = {
            'dfs.nameservices': nameservice,
            f'dfs.ha.namenodes.{nameservice}': ','.join(names),
            f'dfs.client.failover.proxy.provider.{nameservice}':
                self._get(f'dfs.client.failover.proxy.provider.{nameservice}') or _FAILOVER_PROVIDER,
        }
        for name in names:
            key = f'dfs.namenode.rpc-address.{nameservice}.{name}'
            configuration[key] = self._get(key) or ''
        return configuration


# -- connecting ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class NamenodeTarget:
    """What to connect to: a host (or an HA nameservice, with port 0) and the extra Hadoop properties."""

    host: str
    port: int
    extra_conf: dict[str, str] = field(default_factory=dict)


def check_hdfs_driver(hdfs_driver: str) -> None:
    """Raise ``ValueError`` unless ``hdfs_driver`` is one of Petastorm's driver names."""
    if hdfs_driver not in HDFS_DRIVERS:
        raise ValueError(f"hdfs_driver must be 'libhdfs3' or 'libhdfs', got {hdfs_driver!r}")


def namenode_target(parsed: ParseResult, resolver: HdfsNamenodeResolver) -> NamenodeTarget:
    """Where an ``hdfs://`` URL points (see the module docstring)."""
    host, port = _split_host_port(parsed.netloc)
    if not host:
        nameservice, _ = resolver.resolve_default_hdfs_service()
        host, port = _split_host_port(nameservice)
    if port:
        return NamenodeTarget(host, port)
    if resolver.resolve_hdfs_name_service(host):
        return NamenodeTarget(host, 0, resolver.ha_configuration(host))
    return NamenodeTarget(host, DEFAULT_NAMENODE_PORT)


def connect_hadoop(host: str, port: int, user: str | None = None, **options: Any) -> pafs.FileSystem:
    """``pyarrow.fs.HadoopFileSystem(host, port, user=..., **options)``: the one place that connects to HDFS."""
    return pafs.HadoopFileSystem(host, port, user=user, **options)


def hdfs_filesystem(url: str, storage_options: dict | None = None, hdfs_driver: str = 'libhdfs3',
                    hadoop_configuration: Any = None) -> pafs.FileSystem:
    """A connected ``HadoopFileSystem`` for an ``hdfs://`` URL.

    Raises:
        RuntimeError: no namenode in the URL and no ``fs.defaultFS`` in the configuration.
        StorageError: the connection failed (the message says what the client needs).
    """
    check_hdfs_driver(hdfs_driver)
    parsed = urlparse(url)
    options = dict(storage_options or {})
    user = parsed.username or options.pop('user', None)
    target = namenode_target(parsed, HdfsNamenodeResolver(hadoop_configuration))
    extra_conf = {**target.extra_conf, **(options.pop('extra_conf', None) or {})}
    if extra_conf:
        options['extra_conf'] = extra_conf
    where = target.host if target.port == 0 else f'{target.host}:{target.port}'
    logger.debug('connecting to HDFS %s for %s', where, url)
    try:
        return connect_hadoop(target.host, target.port, user=user, **options)
    except OSError as err:
        raise StorageError(
            f'cannot connect to HDFS {where} for {parsed.scheme}://{parsed.netloc}{parsed.path}: {err}. '
            'pyarrow.fs.HadoopFileSystem needs a Java runtime, libhdfs.so (ARROW_LIBHDFS_DIR or '
            '$HADOOP_HOME/lib/native) and the Hadoop jars on CLASSPATH (export CLASSPATH=$(hadoop classpath '
            '--glob)).') from err


# -- Petastorm's petastorm.hdfs.namenode API ----------------------------------------------------------------------

_NO_FAILOVER = (FileNotFoundError, PermissionError, FileExistsError, IsADirectoryError, NotADirectoryError)


class namenode_failover:  # noqa: N801 - Petastorm's name
    """Method decorator: on an ``OSError``, fail over to the next namenode and call again.

    After ``MAX_FAILOVER_ATTEMPTS`` failovers the call raises :class:`MaxFailoversExceeded`. Errors that say
    something about the path (not found, permission, exists) are raised at once.
    """

    MAX_FAILOVER_ATTEMPTS = 3

    def __init__(self, func: Callable) -> None:
        self._func = func
        functools.update_wrapper(self, func)

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        if obj is None:
            return self
        return functools.partial(self.__call__, obj)

    def __call__(self, obj: Any, *args: Any, **kwargs: Any) -> Any:
        """Call the method on ``obj``, failing over to the next namenode on an ``OSError`` about the connection.

        Raises:
            MaxFailoversExceeded: the call failed after ``MAX_FAILOVER_ATTEMPTS`` failovers (the errors are listed).
        """
        failures: list[BaseException] = []
        while True:
            try:
                return self._func(obj, *args, **kwargs)
            except _NO_FAILOVER:
                raise
            except OSError as err:
                failures.append(err)
                if len(failures) > self.MAX_FAILOVER_ATTEMPTS:
                    raise MaxFailoversExceeded(failures, self.MAX_FAILOVER_ATTEMPTS, self._func.__name__) from err
                logger.warning('HDFS %s failed (%s); failing over to the next namenode', self._func.__name__, err)
                obj._try_next_namenode()


def failover_all_class_methods(decorator: Callable) -> Callable[[type], type]:
    """Class decorator: apply ``decorator`` to every public method defined in the class body."""
    def decorate(cls: type) -> type:
        for name, value in list(vars(cls).items()):
            if not name.startswith('_') and callable(value):
                setattr(cls, name, decorator(value))
        return cls
    return decorate


@failover_all_class_methods(namenode_failover)
class HAHdfsClient(pafs.FileSystemHandler):
    """A ``pyarrow.fs`` handler over HDFS namenodes that fails over to the next one when a call fails.

    Petastorm's class subclassed the removed ``pyarrow.hdfs.HadoopFileSystem``; this one is a
    ``pyarrow.fs.FileSystemHandler``: use it as ``pyarrow.fs.PyFileSystem(HAHdfsClient(...))``, which is what
    :meth:`HdfsConnector.connect_to_either_namenode` returns.

    Args:
        connector_cls: a class with :meth:`HdfsConnector.hdfs_connect_namenode`.
        list_of_namenodes: ``['host:port', ...]``.
        user: the HDFS user.
    """

    def __init__(self, connector_cls: Any, list_of_namenodes: list[str], user: str | None = None) -> None:
        if not list_of_namenodes:
            raise HdfsConnectError('HAHdfsClient needs at least one namenode')
        self._connector_cls = connector_cls
        self._list_of_namenodes = list(list_of_namenodes)
        self._user = user
        self._index_of_nn = -1
        self._fs: pafs.FileSystem = self._connect_next_namenode()

    def __reduce__(self) -> tuple:
        return HAHdfsClient, (self._connector_cls, self._list_of_namenodes, self._user)

    def _try_next_namenode(self) -> None:
        """Fail over: connect to the next namenode that accepts (``namenode_failover`` calls this)."""
        self._fs = self._connect_next_namenode()

    def _connect_next_namenode(self) -> pafs.FileSystem:
        errors = []
        for _ in range(len(self._list_of_namenodes)):
            self._index_of_nn = (self._index_of_nn + 1) % len(self._list_of_namenodes)
            namenode = self._list_of_namenodes[self._index_of_nn]
            try:
                return self._connector_cls.hdfs_connect_namenode(urlparse(f'hdfs://{namenode}'), user=self._user)
            except OSError as err:
                errors.append(f'{namenode}: {err}')
        raise HdfsConnectError(f'Unable to connect to any HDFS namenode of {self._list_of_namenodes}: '
                               f'{"; ".join(errors)}')

    @property
    def namenode(self) -> str:
        """The namenode in use."""
        return self._list_of_namenodes[self._index_of_nn]

    # The methods below are pyarrow's FileSystemHandler protocol. Each runs on the namenode in use; on an OSError
    # other than one about the path itself, namenode_failover connects to the next namenode and calls again.

    def get_type_name(self) -> str:
        """``'ha-hdfs'``, the name pyarrow shows for this filesystem."""
        return 'ha-hdfs'

    def normalize_path(self, path: str) -> str:
        """``path`` unchanged: HDFS paths are used as given."""
        return path

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        """The ``FileInfo`` of each path (type ``NotFound`` for a missing one)."""
        return self._fs.get_file_info(paths)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        """The ``FileInfo`` of every entry the selector lists (recursively if it says so)."""
        return self._fs.get_file_info(selector)

    def create_dir(self, path: str, recursive: bool) -> None:
        """Create the directory ``path`` (and its missing parents when ``recursive``)."""
        self._fs.create_dir(path, recursive=recursive)

    def delete_dir(self, path: str) -> None:
        """Delete the directory ``path`` and everything in it."""
        self._fs.delete_dir(path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        """Delete everything in the directory ``path``, keeping the directory.

        Args:
            path: the directory.
            missing_dir_ok: succeed when ``path`` does not exist instead of raising ``FileNotFoundError``.
        """
        self._fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self) -> None:
        """Delete everything in the filesystem's root directory."""
        self._fs.delete_dir_contents('/', accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        """Delete the file ``path``."""
        self._fs.delete_file(path)

    def move(self, src: str, dest: str) -> None:
        """Move (rename) the file or directory ``src`` to ``dest``."""
        self._fs.move(src, dest)

    def copy_file(self, src: str, dest: str) -> None:
        """Copy the file ``src`` to ``dest``."""
        self._fs.copy_file(src, dest)

    def open_input_stream(self, path: str) -> Any:
        """A sequential-read stream of the file ``path``."""
        return self._fs.open_input_stream(path)

    def open_input_file(self, path: str) -> Any:
        """A random-access (seekable) reader of the file ``path``."""
        return self._fs.open_input_file(path)

    def open_output_stream(self, path: str, metadata: Any) -> Any:
        """A stream writing the file ``path`` (replacing it); ``metadata`` is pyarrow's key-value metadata."""
        return self._fs.open_output_stream(path, metadata=metadata)

    def open_append_stream(self, path: str, metadata: Any) -> Any:
        """A stream appending to the file ``path``; ``metadata`` is pyarrow's key-value metadata."""
        return self._fs.open_append_stream(path, metadata=metadata)


class HdfsConnector:
    """Connections to HDFS namenodes (classmethods; subclass it to connect differently, e.g. in tests)."""

    MAX_NAMENODES = 2

    @classmethod
    def hdfs_connect_namenode(cls, url: ParseResult, driver: str = 'libhdfs3',
                              user: str | None = None) -> pafs.FileSystem:
        """Connect to the namenode ``url`` names (port 8020 when it has none).

        Args:
            url: a parsed ``hdfs://host[:port]`` URL.
            driver: ``'libhdfs3'`` or ``'libhdfs'``; both use pyarrow's ``HadoopFileSystem``.
            user: the HDFS user (default: the URL's user, else the process's).
        """
        check_hdfs_driver(driver)
        host, port = _split_host_port(url.netloc)
        return connect_hadoop(host or 'default', port or DEFAULT_NAMENODE_PORT, user=user or url.username)

    @classmethod
    def connect_to_either_namenode(cls, list_of_namenodes: list[str], user: str | None = None) -> pafs.FileSystem:
        """A filesystem over the first namenode that accepts a connection, failing over to the others later.

        Raises:
            HdfsConnectError: no namenode of the list accepted a connection.
        """
        return pafs.PyFileSystem(HAHdfsClient(cls, list(list_of_namenodes), user=user))

