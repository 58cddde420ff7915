"""How results and errors travel from a worker process back to the parent.

A dict result's plain ndarrays (no Python objects inside) are packed into one POSIX shared memory block; the
worker sends only a small :class:`ShmResult` descriptor. The parent copies every array out of the block with
one memcpy each and unlinks the block at once, so a block lives only while its result is in transit. All other
values (object arrays, scalars, None, non-dict results, small results) are pickled as usual.

Block names are derived from a per-pool prefix and the item's sequence number, so the parent knows the name of
every block a worker may have created and can remove the ones whose descriptor never arrived (a worker killed
in the middle of an item). The worker's ``SharedMemory`` registers the block with the resource tracker shared by
the whole process tree and the parent unregisters it when unlinking, which keeps the tracker silent in normal
operation and lets it remove the blocks if the parent itself is killed.
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import secrets
import struct
import traceback
from dataclasses import dataclass
from multiprocessing.shared_memory import SharedMemory
from typing import Any

import numpy as np

from petastorm.pools.base import RemoteTraceback, WorkerFunctionError

logger = logging.getLogger(__name__)

# Results whose shareable arrays hold fewer bytes than this are pickled: the system calls that create, map
# and unlink a block cost more than copying a few pages through the pipe.
INLINE_LIMIT_BYTES = 64 * 1024
# Cache-line alignment keeps every array's copy on the fast path.
_ALIGNMENT = 64
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# A reply starts with a fixed header (kind, seq) so that the parent knows which item it is about even when the
# pickled payload after it cannot be loaded.
REPLY_OK, REPLY_ERROR, REPLY_CANCELLED = 0, 1, 2
_REPLY_HEADER = struct.Struct('<Bq')


def encode_reply(kind: int, seq: int, payload: Any = None) -> memoryview:
    """Worker side: the bytes of one reply (header, then the pickled payload, with no extra copy)."""
    buffer = io.BytesIO()
    buffer.write(_REPLY_HEADER.pack(kind, seq))
    if kind != REPLY_CANCELLED:
        pickle.dump(payload, buffer, protocol=PICKLE_PROTOCOL)
    return buffer.getbuffer()


def decode_reply_header(data: bytes) -> tuple[int, int]:
    """Parent side: ``(kind, seq)`` of a reply."""
    kind, seq = _REPLY_HEADER.unpack_from(data)
    return kind, seq


def decode_reply_payload(data: bytes) -> Any:
    """Parent side: the payload of a reply (may raise whatever unpickling raises)."""
    return pickle.loads(memoryview(data)[_REPLY_HEADER.size:])


@dataclass(frozen=True)
class ShmArray:
    """Where one array of a result lies in its shared memory block."""

    key: Any
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class ShmResult:
    """The descriptor of a dict result whose big arrays are in the shared memory block ``name``."""

    name: str
    keys: tuple[Any, ...]
    arrays: tuple[ShmArray, ...]
    others: dict[Any, Any]


def new_block_prefix() -> str:
    """A random prefix for the block names of one pool (short: macOS allows 31 characters per name)."""
    return f'psm{secrets.token_hex(5)}_'


def block_name(prefix: str, seq: int) -> str:
    """The name of the block that may hold the result of item ``seq``."""
    return f'{prefix}{seq:x}'


def _shareable(value: Any) -> bool:
    return type(value) is np.ndarray and not value.dtype.hasobject and value.nbytes > 0


def pack_result(result: Any, name: str) -> Any:
    """Worker side: return what to send for ``result``, moving big arrays into a block called ``name``."""
    if type(result) is not dict:
        return result
    layout: list[ShmArray] = []
    offset = 0
    for key, value in result.items():
        if _shareable(value):
            layout.append(ShmArray(key, value.dtype, value.shape, offset))
            offset += -(-value.nbytes // _ALIGNMENT) * _ALIGNMENT
    if offset < INLINE_LIMIT_BYTES:
        return result
    block = SharedMemory(name=name, create=True, size=offset)
    try:
        _copy_into(block, layout, result)
    except BaseException:
        release_block(block)
        raise
    _close(block)
    placed = {spec.key for spec in layout}
    others = {key: value for key, value in result.items() if key not in placed}
    return ShmResult(name, tuple(result), tuple(layout), others)


def _copy_into(block: SharedMemory, layout: list[ShmArray], result: dict[Any, Any]) -> None:
    for spec in layout:
        target = np.ndarray(spec.shape, spec.dtype, buffer=block.buf, offset=spec.offset)
        target[...] = result[spec.key]
        del target  # the block cannot be closed while a view of it exists


def unpack_result(payload: Any) -> Any:
    """Parent side: rebuild the result described by ``payload``, copying arrays out of and unlinking its block."""
    if type(payload) is not ShmResult:
        return payload
    block = SharedMemory(name=payload.name)
    try:
        arrays = {spec.key: _copy_out(block, spec) for spec in payload.arrays}
    finally:
        release_block(block)
    return {key: arrays[key] if key in arrays else payload.others[key] for key in payload.keys}


def _copy_out(block: SharedMemory, spec: ShmArray) -> np.ndarray:
    source = np.ndarray(spec.shape, spec.dtype, buffer=block.buf, offset=spec.offset)
    try:
        return source.copy()
    finally:
        del source


def discard_payload(payload: Any) -> None:
    """Parent side: drop a result nobody wants any more, unlinking its block if it has one."""
    if type(payload) is ShmResult:
        unlink_block(payload.name)


def _close(block: SharedMemory) -> None:
    try:
        block.close()
    except BufferError:
        # A view is still referenced (e.g. by a traceback frame); the mapping goes away with it.
        logger.debug('shared memory block %s still has views; leaving its mapping to the garbage collector',
                     block.name)


def release_block(block: SharedMemory) -> None:
    """Close and unlink ``block`` (unlinking also unregisters it from the resource tracker)."""
    _close(block)
    try:
        block.unlink()
    except FileNotFoundError:
        pass


def unlink_block(name: str) -> None:
    """Remove the block called ``name`` if it exists (for blocks whose descriptor never arrived)."""
    try:
        block = SharedMemory(name=name)
    except FileNotFoundError:
        return
    except (OSError, ValueError):
        # A worker killed between creating and sizing a block leaves an empty one that cannot be mapped; no
        # tracker registration exists yet at that point, so removing the file is enough.
        _unlink_path(name)
        return
    release_block(block)


def _unlink_path(name: str) -> None:
    path = os.path.join('/dev/shm', name.lstrip('/'))
    try:
        os.unlink(path)
    except OSError as exc:
        logger.warning('could not remove shared memory block %s: %s', name, exc)


@dataclass(frozen=True)
class RemoteException:
    """An exception raised by the worker function, in a form that always crosses a pipe."""

    pickled: bytes | None
    type_name: str
    message: str
    traceback_text: str


def encode_exception(exc: BaseException) -> RemoteException:
    """Worker side: capture ``exc`` with its formatted traceback; keep the object if it survives pickling."""
    text = ''.join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    try:
        pickled: bytes | None = pickle.dumps(exc, protocol=PICKLE_PROTOCOL)
        pickle.loads(pickled)  # some exceptions pickle but cannot be rebuilt (custom __init__ signatures)
    except Exception:
        pickled = None
    try:
        message = str(exc)
    except Exception:
        message = '<unprintable exception>'
    return RemoteException(pickled, f'{type(exc).__module__}.{type(exc).__qualname__}', message, text)


def decode_exception(remote: RemoteException) -> BaseException:
    """Parent side: the exception to raise, of the original type when possible, with the remote traceback chained."""
    exc: BaseException | None = None
    if remote.pickled is not None:
        try:
            exc = pickle.loads(remote.pickled)
        except Exception:
            exc = None
    if exc is None:
        exc = WorkerFunctionError(f'{remote.type_name}: {remote.message}')
    exc.__cause__ = RemoteTraceback(remote.traceback_text)
    return exc
