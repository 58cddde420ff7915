"""How results and errors travel from a worker process back to the parent.

The plain ndarrays (no Python objects inside) of a dict result, or of the ``carried_arrays()`` of an
:class:`~petastorm.pools.base.ArrayCarrier` result, are packed into one shared memory slot of the worker (see
:mod:`petastorm.pools._shm`); the worker sends only a small :class:`ShmResult` descriptor holding the rest of the
result: the dict's other values, or the carrier rebuilt with ``with_carried_arrays`` around its unshareable arrays
only. The parent hands out arrays that view its mapping of the slot directly (no copy) and puts them back in the
original key order; the slot goes back to the worker when the last of those arrays, or of views of them, is
garbage collected (see :mod:`petastorm.pools._shm_parent`). All other values (object arrays, scalars, None, other
result types, small results) are pickled as usual, and so is everything when shared memory is not available (e.g.
a full ``/dev/shm``).
"""

from __future__ import annotations

import io
import logging
import os
import pickle
import secrets
import struct
import traceback
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from petastorm.pools._shm import SlotWriter
from petastorm.pools._shm_parent import array_over
from petastorm.pools.base import ArrayCarrier, RemoteTraceback, WorkerFunctionError

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
    """The descriptor of a result whose big arrays are in the first ``size`` bytes of slot ``name``.

    ``keys`` is the order of the dict's keys (or of the carrier's arrays); ``others`` holds the dict's values that
    are not in the slot; ``carrier`` (for an :class:`~petastorm.pools.base.ArrayCarrier`) is the result whose
    ``carried_arrays()`` are only those that are not in the slot.
    """

    slot: int
    name: str
    size: int
    keys: tuple[Any, ...]
    arrays: tuple[ShmArray, ...]
    others: dict[Any, Any]
    carrier: ArrayCarrier | None = None


def new_block_prefix() -> str:
    """A fresh prefix for the slot names of one pool of this process.

    It starts with :func:`process_block_prefix` so that the names of one process's pools can be told apart from
    other processes' (by tests, and by whoever looks at ``/dev/shm``); short, because macOS allows 31 characters
    per name.
    """
    return f'{process_block_prefix()}{secrets.token_hex(4)}_'


def process_block_prefix(pid: int | None = None) -> str:
    """The start of the slot names of every pool of process ``pid`` (default: this process)."""
    return f'psm{os.getpid() if pid is None else pid:x}_'


def _shareable(value: Any) -> bool:
    return type(value) is np.ndarray and not value.dtype.hasobject and value.nbytes > 0


def pack_result(result: Any, writer: SlotWriter) -> Any:
    """Worker side: return what to send for ``result``, moving its big arrays into a slot of ``writer``."""
    carrier: ArrayCarrier | None
    if type(result) is dict:
        arrays: Mapping[Any, Any] = result
        carrier = None
    elif isinstance(result, ArrayCarrier):
        arrays = result.carried_arrays()
        carrier = result
    else:
        return result
    layout: list[ShmArray] = []
    offset = 0
    for key, value in arrays.items():
        if _shareable(value):
            layout.append(ShmArray(key, value.dtype, value.shape, offset))
            offset += -(-value.nbytes // _ALIGNMENT) * _ALIGNMENT
    if offset < INLINE_LIMIT_BYTES:
        return result
    try:
        slot, name = writer.write(offset, [(spec.offset, arrays[spec.key]) for spec in layout])
    except OSError as exc:
        if not writer.failed:
            writer.failed = True
            logger.warning('petastorm process pool: could not use shared memory (%s); results are pickled through '
                           'a pipe instead, which is slower (a container may need a bigger /dev/shm)', exc)
        return result
    try:
        placed = {spec.key for spec in layout}
        others = {key: value for key, value in arrays.items() if key not in placed}
        if carrier is None:
            return ShmResult(slot, name, offset, tuple(arrays), tuple(layout), others)
        return ShmResult(slot, name, offset, tuple(arrays), tuple(layout), {}, carrier.with_carried_arrays(others))
    except BaseException:
        writer.release([(slot, True)])  # e.g. with_carried_arrays failed: nobody will read the slot
        raise


def unpack_result(payload: Any, wrap: Callable[[ShmResult], np.ndarray]) -> Any:
    """Parent side: rebuild the result described by ``payload``; its arrays view the exporter ``wrap`` returns."""
    if type(payload) is not ShmResult:
        return payload
    exporter = wrap(payload)
    arrays = {spec.key: array_over(exporter, spec.dtype, spec.shape, spec.offset) for spec in payload.arrays}
    if payload.carrier is None:
        return {key: arrays[key] if key in arrays else payload.others[key] for key in payload.keys}
    unshared = payload.carrier.carried_arrays()
    return payload.carrier.with_carried_arrays({key: arrays[key] if key in arrays else unshared[key]
                                                for key in payload.keys})


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
        pickled_bytes = pickle.dumps(exc, protocol=PICKLE_PROTOCOL)
        pickle.loads(pickled_bytes)  # some exceptions pickle but cannot be rebuilt (custom __init__ signatures)
        pickled: bytes | None = pickled_bytes
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
