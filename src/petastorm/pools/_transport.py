"""How results and errors travel from a worker process back to the parent.

A dict result's plain ndarrays (no Python objects inside) are packed into one shared memory slot of the worker
(see :mod:`petastorm.pools._shm`); the worker sends only a small :class:`ShmResult` descriptor. The parent hands
out arrays that view its mapping of the slot directly (no copy); the slot goes back to the worker when the last
of those arrays, or of views of them, is garbage collected (see :mod:`petastorm.pools._shm_parent`). All other
values (object arrays, scalars, None, non-dict results, small results) are pickled as usual, and so is everything
when shared memory is not available (e.g. a full ``/dev/shm``).
"""

from __future__ import annotations

import ctypes
import io
import logging
import pickle
import secrets
import struct
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.pools._shm import SlotWriter
from petastorm.pools._shm_parent import array_over
from petastorm.pools.base import RemoteTraceback, WorkerFunctionError

logger = logging.getLogger(__name__)

# Results whose shareable arrays hold fewer bytes than this are pickled: the system calls that create, map
# and release a slot cost more than copying a few pages through the pipe.
INLINE_LIMIT_BYTES = 64 * 1024
# Cache-line alignment: arrays handed to the consumer are as well aligned as freshly allocated ones.
_ALIGNMENT = 64
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# A reply starts with a fixed header so that the parent knows which item and slot it is about even when the
# pickled payload after it cannot be loaded: kind, seq, the slot holding the result's arrays (-1: none), how many
# slots the worker has created so far (the parent removes the names of a dead worker's slots) and how many ids of
# slots destroyed since the previous reply follow the payload (the parent drops its mappings of those).
# REPLY_SLOTS only reports destroyed slots (seq -1).
REPLY_OK, REPLY_ERROR, REPLY_CANCELLED, REPLY_SLOTS = 0, 1, 2, 3
_REPLY_HEADER = struct.Struct('<Bqqqq')
_SLOT_ID = struct.Struct('<q')


@dataclass(frozen=True)
class ReplyHeader:
    """The fixed part of a reply, and the destroyed slots listed after its payload."""

    kind: int
    seq: int
    slot: int
    slots_created: int
    destroyed: tuple[int, ...]


def encode_reply(kind: int, seq: int, slots: SlotWriter, payload: Any = None) -> memoryview:
    """Worker side: the bytes of one reply, without extra copies of the payload.

    Raises whatever pickling ``payload`` raises, before anything is taken from ``slots``.
    """
    buffer = io.BytesIO()
    buffer.write(bytes(_REPLY_HEADER.size))  # filled in below
    if kind in (REPLY_OK, REPLY_ERROR):
        pickle.dump(payload, buffer, protocol=PICKLE_PROTOCOL)
    destroyed = slots.take_destroyed()
    for slot_id in destroyed:
        buffer.write(_SLOT_ID.pack(slot_id))
    slot = payload.slot if type(payload) is ShmResult else -1
    data = buffer.getbuffer()
    _REPLY_HEADER.pack_into(data, 0, kind, seq, slot, slots.created, len(destroyed))
    return data


def decode_reply_header(data: bytes) -> ReplyHeader:
    """Parent side: the header of a reply."""
    kind, seq, slot, slots_created, destroyed_count = _REPLY_HEADER.unpack_from(data)
    start = len(data) - destroyed_count * _SLOT_ID.size
    destroyed = tuple(_SLOT_ID.unpack_from(data, start + i * _SLOT_ID.size)[0] for i in range(destroyed_count))
    return ReplyHeader(kind, seq, slot, slots_created, destroyed)


def decode_reply_payload(data: bytes, header: ReplyHeader) -> Any:
    """Parent side: the payload of a reply (may raise whatever unpickling raises)."""
    end = len(data) - len(header.destroyed) * _SLOT_ID.size
    return pickle.loads(memoryview(data)[_REPLY_HEADER.size:end])


@dataclass(frozen=True)
class ShmArray:
    """Where one array of a result lies in its shared memory slot."""

    key: Any
    dtype: np.dtype
    shape: tuple[int, ...]
    offset: int


@dataclass(frozen=True)
class ShmResult:
    """The descriptor of a dict result whose big arrays are in the first ``size`` bytes of slot ``name``."""

    slot: int
    name: str
    size: int
    keys: tuple[Any, ...]
    arrays: tuple[ShmArray, ...]
    others: dict[Any, Any]


def new_block_prefix() -> str:
    """A random prefix for the slot names of one pool (short: macOS allows 31 characters per name)."""
    return f'psm{secrets.token_hex(5)}_'


def _shareable(value: Any) -> bool:
    return type(value) is np.ndarray and not value.dtype.hasobject and value.nbytes > 0


def pack_result(result: Any, writer: SlotWriter) -> Any:
    """Worker side: return what to send for ``result``, moving its big arrays into a slot of ``writer``."""
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
    try:
        slot, name = writer.write(offset, [(spec.offset, result[spec.key]) for spec in layout])
    except OSError as exc:
        if not writer.failed:
            writer.failed = True
            logger.warning('petastorm process pool: could not use shared memory (%s); results are pickled through '
                           'a pipe instead, which is slower (a container may need a bigger /dev/shm)', exc)
        return result
    placed = {spec.key for spec in layout}
    others = {key: value for key, value in result.items() if key not in placed}
    return ShmResult(slot, name, offset, tuple(result), tuple(layout), others)


def unpack_result(payload: Any, wrap: Callable[[ShmResult], ctypes.Array]) -> Any:
    """Parent side: rebuild the result described by ``payload``; its arrays view the buffer ``wrap`` returns."""
    if type(payload) is not ShmResult:
        return payload
    buffer = wrap(payload)
    arrays = {spec.key: array_over(buffer, spec.dtype, spec.shape, spec.offset) for spec in payload.arrays}
    return {key: arrays[key] if key in arrays else payload.others[key] for key in payload.keys}


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
