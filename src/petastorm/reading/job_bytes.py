"""Bytes exchanged between the ranks of a ``torch.distributed`` job, for sharing one plan (see ``job_plan``).

Each exchange is a collective: every rank of the default group calls it, in the same order. Bytes travel as uint8
tensors on the device the backend needs (CPU for gloo, the current GPU for NCCL), each after its length. A rank
that failed sends its error's text instead, flagged by a negative length, so that the others raise, naming it,
instead of waiting for bytes that never come. torch is never imported here: a job has it imported already.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ['Sent', 'all_gather_fixed', 'broadcast_bytes', 'gather_bytes']


class Sent:
    """What one rank sent: its bytes, or (``failed``) its error's text, as bytes."""

    __slots__ = ('data', 'failed')

    def __init__(self, data: bytes, failed: bool) -> None:
        self.data = data
        self.failed = failed


def broadcast_bytes(distributed: Any, data: bytes | None, failed: bool = False) -> Sent:
    """Rank 0's ``data`` on every rank (rank 0 passes its bytes, the others None)."""
    torch, device = _torch_and_device(distributed)
    header = torch.tensor([_signed_length(data, failed) if data is not None else 0], dtype=torch.int64,
                          device=device)
    distributed.broadcast(header, src=0)
    length = int(header.item())
    payload = _tensor_of(torch, device, data, abs(length)) if data is not None else \
        torch.empty(abs(length), dtype=torch.uint8, device=device)
    if length:
        distributed.broadcast(payload, src=0)
    return Sent(payload.cpu().numpy().tobytes(), length < 0)


def gather_bytes(distributed: Any, data: bytes, failed: bool = False) -> list[Sent] | None:
    """Every rank's ``data`` on rank 0, in rank order (None on the other ranks).

    The ranks' lengths are gathered first; each rank's bytes then travel padded to the longest.
    """
    torch, device = _torch_and_device(distributed)
    world = distributed.get_world_size()
    lengths = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(world)]
    distributed.all_gather(lengths, torch.tensor([_signed_length(data, failed)], dtype=torch.int64, device=device))
    signed = [int(length.item()) for length in lengths]
    longest = max(abs(length) for length in signed)
    if longest == 0:
        return [Sent(b'', length < 0) for length in signed] if distributed.get_rank() == 0 else None
    payload = _tensor_of(torch, device, data + bytes(longest - len(data)), longest)
    received = [torch.empty(longest, dtype=torch.uint8, device=device) for _ in range(world)] \
        if distributed.get_rank() == 0 else None
    distributed.gather(payload, received, dst=0)
    if received is None:
        return None
    return [Sent(tensor.cpu().numpy().tobytes()[:abs(length)], length < 0)
            for tensor, length in zip(received, signed, strict=True)]


def all_gather_fixed(distributed: Any, data: bytes) -> list[bytes]:
    """Every rank's ``data`` on every rank, in rank order; every rank sends as many bytes."""
    torch, device = _torch_and_device(distributed)
    received = [torch.empty(len(data), dtype=torch.uint8, device=device)
                for _ in range(distributed.get_world_size())]
    distributed.all_gather(received, _tensor_of(torch, device, data, len(data)))
    return [tensor.cpu().numpy().tobytes() for tensor in received]


def _signed_length(data: bytes, failed: bool) -> int:
    return -len(data) if failed else len(data)


def _tensor_of(torch: Any, device: Any, data: bytes, length: int) -> Any:
    if not length:
        return torch.empty(0, dtype=torch.uint8, device=device)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)


def _torch_and_device(distributed: Any) -> tuple[Any, Any]:
    torch = sys.modules['torch']
    device = torch.device('cuda', torch.cuda.current_device()) if distributed.get_backend() == 'nccl' else \
        torch.device('cpu')
    return torch, device
