"""A typed file format for the values a local disk cache stores that are not Arrow tables.

What it trusts: the cache directory is on a local disk and written by the user who reads it. Even so, reading an
entry never runs code: there is no pickle, NumPy arrays are read with ``allow_pickle=False``, and the structure is
rebuilt from a fixed set of tags. A damaged or unknown entry raises ``ValueError`` (the cache then computes the
value again). Only values that come back with the same types are written; anything else is refused with
:class:`UncacheableValueError` instead of being stored in a lossy or unsafe way.

Layout of an entry::

    MAGIC (16 bytes) | n = header size (8 bytes, little endian) | header (n bytes of UTF-8 JSON) | blobs

The header is ``{"value": node, "blobs": [size, ...]}``; the blobs follow it back to back, in that order. A node is

==========================================  ===========================================================
``null``, ``true``/``false``, a number       ``None``, ``bool``, ``int``, ``float`` (NaN and infinities too)
a string                                     ``str``
a list of nodes                              ``list``
``{"tuple": [node, ...]}``                   ``tuple``
``{"dict": [[key, value], ...]}``            ``dict`` (keys are nodes too; insertion order is kept)
``{"bytes": i}``                             ``bytes``: blob ``i``
``{"ndarray": i}``                           a NumPy array: blob ``i`` is a ``.npy`` file
``{"npscalar": i}``                          a NumPy scalar: blob ``i`` is a 0-d ``.npy`` array
``{"objarray": [shape, [node, ...]]}``       an object-dtype array, its items in C order
``{"decimal": "1.50"}``                      ``decimal.Decimal``
==========================================  ===========================================================

Types are matched exactly (a subclass such as an ``IntEnum``, a named tuple or a masked array is refused), so
every value comes back as the type it went in as.
"""

from __future__ import annotations

import decimal
import io
import json
import math
from collections.abc import Callable
from typing import Any, BinaryIO

import numpy as np

from petastorm.errors import PetastormError

__all__ = ['MAGIC', 'UncacheableValueError', 'encode_value', 'read_value', 'write_value']

MAGIC = b'PETASTORM-VAL-1\n'
_HEADER_SIZE_BYTES = 8
_SUPPORTED = ('None, bool, int, float, str, bytes, decimal.Decimal, NumPy arrays and scalars, and lists, tuples '
              'and dicts of these')


class UncacheableValueError(PetastormError, TypeError):
    """A value holds something the local disk cache cannot store safely (the message says what and where)."""


# -- writing ----------------------------------------------------------------------------------------------------


class _Encoder:
    def __init__(self) -> None:
        self.blobs: list[bytes | memoryview] = []
        self._open: set[int] = set()  # ids of the containers being encoded, to refuse cycles

    def node(self, value: Any, where: str) -> Any:
        kind = type(value)
        if value is None or kind in (bool, int, str):
            return value
        if kind is float:
            return value  # json writes NaN and Infinity, and reads them back
        if kind is bytes:
            return {'bytes': self._blob(value)}
        if kind is decimal.Decimal:
            return {'decimal': str(value)}
        if kind is np.ndarray:
            return self._array(value, where)
        if isinstance(value, np.generic) and kind.__module__ == 'numpy':
            if value.dtype.hasobject:
                raise self._refuse(value, where)
            return {'npscalar': self._blob(_npy_bytes(np.asarray(value), where))}
        if kind in (list, tuple, dict):
            return self._container(value, where)
        raise self._refuse(value, where)

    def _container(self, value: list | tuple | dict, where: str) -> Any:
        """A list, tuple or dict and what it holds; one that holds itself is refused."""
        if id(value) in self._open:
            raise UncacheableValueError(f'{where} contains itself; the local disk cache stores only acyclic values')
        self._open.add(id(value))
        try:
            if isinstance(value, dict):
                return {'dict': [[self.node(k, f'a key of {where}'), self.node(v, f'{where}[{k!r}]')]
                                 for k, v in value.items()]}
            items = [self.node(item, f'{where}[{i}]') for i, item in enumerate(value)]
            return items if type(value) is list else {'tuple': items}
        finally:
            self._open.discard(id(value))

    def _array(self, array: np.ndarray, where: str) -> Any:
        if array.dtype == object:
            items = [self.node(item, f'{where}.flat[{i}]') for i, item in enumerate(array.flat)]
            return {'objarray': [list(array.shape), items]}
        if array.dtype.hasobject:  # a structured dtype with object fields
            raise self._refuse(array, where)
        return {'ndarray': self._blob(_npy_bytes(array, where))}

    def _blob(self, data: bytes | memoryview) -> int:
        self.blobs.append(data)
        return len(self.blobs) - 1

    @staticmethod
    def _refuse(value: Any, where: str) -> UncacheableValueError:
        kind = type(value)
        detail = f' of dtype {value.dtype}' if isinstance(value, (np.ndarray, np.generic)) else ''
        return UncacheableValueError(
            f'the local disk cache cannot store {where}: a {kind.__module__}.{kind.__qualname__}{detail} has no safe '
            f'encoding. It stores {_SUPPORTED} (exact types), and pyarrow Tables.')


def _npy_bytes(array: np.ndarray, where: str) -> memoryview:
    buffer = io.BytesIO()
    try:
        np.lib.format.write_array(buffer, array, allow_pickle=False)
    except ValueError as err:  # pragma: no cover - object dtypes are refused before this
        raise UncacheableValueError(f'the local disk cache cannot store {where}: {err}') from err
    return buffer.getbuffer()


def encode_value(value: Any) -> list[bytes | memoryview]:
    """The bytes of the entry holding ``value`` (see the module doc), as chunks to write one after the other.

    Raises:
        UncacheableValueError: ``value`` holds a type that has no safe encoding.
    """
    encoder = _Encoder()
    root = encoder.node(value, 'the value')
    header = json.dumps({'value': root, 'blobs': [len(blob) for blob in encoder.blobs]},
                        separators=(',', ':')).encode('utf-8')
    return [MAGIC, len(header).to_bytes(_HEADER_SIZE_BYTES, 'little'), header, *encoder.blobs]


def write_value(file: BinaryIO, value: Any) -> None:
    """Write the entry holding ``value`` to ``file``.

    Raises:
        UncacheableValueError: ``value`` holds a type that has no safe encoding; nothing was written.
    """
    for chunk in encode_value(value):
        file.write(chunk)


# -- reading ----------------------------------------------------------------------------------------------------


class _Decoder:
    def __init__(self, file: BinaryIO, start: int, sizes: list[int]) -> None:
        self._file = file
        self._sizes = sizes
        self._offsets = [start]
        for size in sizes:
            self._offsets.append(self._offsets[-1] + size)
        self._tags: dict[str, Callable[[Any], Any]] = {
            'tuple': lambda items: tuple(self.node(item) for item in _expect(items, list)),
            'dict': self._dict,
            'bytes': self._bytes,
            'ndarray': self._ndarray,
            'npscalar': self._npscalar,
            'objarray': self._objarray,
            'decimal': self._decimal,
        }

    def node(self, node: Any) -> Any:
        if node is None or type(node) in (bool, int, float, str):
            return node
        if type(node) is list:
            return [self.node(item) for item in node]
        if type(node) is dict and len(node) == 1:
            (tag, payload), = node.items()
            decode = self._tags.get(tag)
            if decode is not None:
                return decode(payload)
        raise ValueError(f'unknown node {str(node)[:80]!r} in a local disk cache entry')

    def _dict(self, pairs: Any) -> dict:
        result = {}
        for pair in _expect(pairs, list):
            if type(pair) is not list or len(pair) != 2:
                raise ValueError('a dict item of a local disk cache entry is not a [key, value] pair')
            key = self.node(pair[0])
            try:
                result[key] = self.node(pair[1])
            except TypeError as err:  # an unhashable key: the entry was not written by write_value
                raise ValueError(f'an unhashable dict key in a local disk cache entry: {err}') from err
        return result

    @staticmethod
    def _decimal(text: Any) -> decimal.Decimal:
        try:
            return decimal.Decimal(_expect(text, str))
        except decimal.InvalidOperation as err:
            raise ValueError(f'a decimal of a local disk cache entry is not a number: {text[:40]!r}') from err

    def _seek(self, index: Any) -> int:
        if type(index) is not int or not 0 <= index < len(self._sizes):
            raise ValueError(f'blob {index!r} of a local disk cache entry does not exist')
        self._file.seek(self._offsets[index])
        return self._sizes[index]

    def _bytes(self, index: Any) -> bytes:
        size = self._seek(index)
        data = self._file.read(size)
        if len(data) != size:
            raise ValueError('a local disk cache entry is truncated')
        return data

    def _ndarray(self, index: Any) -> np.ndarray:
        self._seek(index)
        array = np.lib.format.read_array(self._file, allow_pickle=False)
        if self._file.tell() != self._offsets[index + 1]:
            raise ValueError('an array of a local disk cache entry does not fill its blob')
        return array

    def _npscalar(self, index: Any) -> np.generic:
        array = self._ndarray(index)
        scalar = array[()] if array.ndim == 0 else None
        if not isinstance(scalar, np.generic):
            raise ValueError('a NumPy scalar of a local disk cache entry is not a 0-d array')
        return scalar

    def _objarray(self, payload: Any) -> np.ndarray:
        if type(payload) is not list or len(payload) != 2:
            raise ValueError('an object array of a local disk cache entry is not a [shape, items] pair')
        shape, items = payload
        if type(shape) is not list or not all(type(n) is int and n >= 0 for n in shape) or type(items) is not list:
            raise ValueError('an object array of a local disk cache entry has no valid shape and items')
        if math.prod(shape) != len(items):
            raise ValueError('an object array of a local disk cache entry has the wrong number of items')
        array = np.empty(tuple(shape), dtype=object)
        for i, item in enumerate(items):
            array.flat[i] = self.node(item)
        return array


def _expect(value: Any, kind: type) -> Any:
    if type(value) is not kind:
        raise ValueError(f'a local disk cache entry holds a {type(value).__name__} where a {kind.__name__} belongs')
    return value


def read_value(file: BinaryIO) -> Any:
    """Read back a value written by :func:`write_value` (``file`` is positioned at the start of the entry).

    Raises:
        ValueError: the entry is damaged, truncated or not in this format.
    """
    if file.read(len(MAGIC)) != MAGIC:
        raise ValueError('not a local disk cache value entry (wrong magic bytes)')
    size = int.from_bytes(file.read(_HEADER_SIZE_BYTES), 'little')
    try:
        header = json.loads(file.read(size).decode('utf-8'))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ValueError(f'the header of a local disk cache entry is damaged: {err}') from err
    if type(header) is not dict or set(header) != {'value', 'blobs'}:
        raise ValueError('the header of a local disk cache entry has the wrong keys')
    sizes = _expect(header['blobs'], list)
    if not all(type(n) is int and n >= 0 for n in sizes):
        raise ValueError('the blob sizes of a local disk cache entry are not sizes')
    return _Decoder(file, len(MAGIC) + _HEADER_SIZE_BYTES + size, sizes).node(header['value'])
