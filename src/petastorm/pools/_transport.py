"""How results and errors travel from a worker process back to the parent.

A dict result's plain ndarrays (no Python objects inside) are packed into one shared memory slot of the worker
(see :mod:`petastorm.pools._shm`); the worker sends only a small :class:`ShmResult` descriptor. The parent maps
the slot and hands out arrays that view the mapping directly (no copy); the slot goes back to the worker when
the last of those arrays, or of views of them, is garbage collected. All other values (object arrays, scalars,
None, non-dict results, small results) are pickled as usual, and so is everything when shared memory is not
available (e.g. a full ``/dev/shm``).
"""

from __future__ import annotations

import io
import logging
import mmap
import pickle
import secrets
import struct
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.pools._shm import SlotWriter, array_over, map_slot
from petastorm.pools.base import RemoteTraceback, WorkerFunctionError

logger = logging.getLogger(__name__)

# Results whose shareable arrays hold fewer bytes than this are pickled: the system calls that create, map
# and release a slot cost more than copying a few pages through the pipe.
INLINE_LIMIT_BYTES = 64 * 1024
# Cache-line alignment: arrays handed to the consumer are as well aligned as freshly allocated ones.
_ALIGNMENT = 64
PICKLE_PROTOCOL = pickle.HIGHEST_PROTOCOL

# A reply starts with a fixed header so that the parent knows which item and slot it is about even when the
# pickled payload after it cannot be loaded: kind, seq, the slot holding the result's arrays (-1: none) and how
# many slots the worker has created so far (the parent removes the names of a dead worker's slots).
REPLY_OK, REPLY_ERROR, REPLY_CANCELLED = 0, 1, 2
_REPLY_HEADER = struct.Struct('<Bqqq')


@dataclass(frozen=True)
class ReplyHeader:
    """The fixed part of a reply."""

    kind: int
    seq: int
    slot: int
    slots_created: int


def encode_reply(kind: int, seq: int, slots_created: int, payload: Any = None) -> memoryview:
    """Worker side: the bytes of one reply (header, then the pickled payload, with no extra copy)."""
    buffer = io.BytesIO()
    slot = payload.slot if type(payload) is ShmResult else -1
    buffer.write(_REPLY_HEADER.pack(kind, seq, slot, slots_created))
    if kind != REPLY_CANCELLED:
        pickle.dump(payload, buffer, protocol=PICKLE_PROTOCOL)
    return buffer.getbuffer()


def decode_reply_header(data: bytes) -> ReplyHeader:
    """Parent side: the header of a reply."""
    return ReplyHeader(*_REPLY_HEADER.unpack_from(data))


def decode_reply_payload(data: bytes) -> Any:
    """Parent side: the payload of a reply (may raise whatever unpickling raises)."""
    return pickle.loads(memoryview(data)[_REPLY_HEADER.size:])


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


def unpack_result(payload: Any, on_mapped: Callable[[mmap.mmap], None]) -> Any:
    """Parent side: rebuild the result described by ``payload``; its arrays view the slot's mapping.

    ``on_mapped`` is called with the mapping before any array refers to it (to track its garbage collection).
    """
    if type(payload) is not ShmResult:
        return payload
    mapped = map_slot(payload.name, payload.size)
    on_mapped(mapped)
    arrays = {spec.key: array_over(mapped, spec.dtype, spec.shape, spec.offset) for spec in payload.arrays}
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
