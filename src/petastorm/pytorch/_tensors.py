"""numpy columns to torch tensors: dtype rules, zero-copy conversion, padding, pinning, tensor buffer ops."""

from __future__ import annotations

import decimal
import logging
from typing import Any

import numpy as np

from petastorm._optional import import_optional
from petastorm.columns import concat_columns, is_nested, take_column
from petastorm.errors import PetastormError
from petastorm.shuffle import ArrayOps

torch = import_optional('torch', 'petastorm.pytorch')

logger = logging.getLogger(__name__)

# Column types torch has no tensor for; the loaders hand them over as lists.
_LIST_KINDS = frozenset('USOMmV')

# Petastorm promoted these dtypes before making tensors; kept so that batches have the same dtypes.
_PROMOTED: dict[np.dtype[Any], np.dtype[Any]] = {
    np.dtype(np.uint16): np.dtype(np.int32), np.dtype(np.uint32): np.dtype(np.int64),
    np.dtype(np.bool_): np.dtype(np.uint8)}


class TorchTypeError(PetastormError, TypeError):
    """A value cannot become part of a torch batch (a None, or a string or Decimal where tensors are needed)."""


def _target_dtype(dtype: np.dtype[Any], bool_to_uint8: bool) -> np.dtype[Any] | None:
    if dtype.kind == 'b' and not bool_to_uint8:
        return None
    return _PROMOTED.get(dtype)


def promote_dtype(array: np.ndarray, bool_to_uint8: bool = True) -> np.ndarray:
    """``array`` with uint16 -> int32, uint32 -> int64 and bool -> uint8 (unless told not to), as Petastorm did."""
    target = _target_dtype(array.dtype, bool_to_uint8)
    return array if target is None else array.astype(target)


def sanitize_value(name: str, value: Any, bool_to_uint8: bool = True) -> Any:
    """One row value made ready for collation: dtypes promoted, None refused with the original message."""
    if value is None:
        raise TorchTypeError(f'Pytorch does not support nullable fields. Found None in {name}')
    if isinstance(value, np.ndarray):
        return promote_dtype(value, bool_to_uint8)
    if isinstance(value, np.generic):
        target = _target_dtype(value.dtype, bool_to_uint8)
        return value if target is None else value.astype(target)
    return value


def check_no_none(name: str, column: np.ndarray) -> None:
    """Raise the original nullable-field error when an object column holds a None."""
    if column.dtype == object and column.ndim == 1 and any(v is None for v in column):
        raise TorchTypeError(f'Pytorch does not support nullable fields. Found None in {name}')


def to_tensor(array: np.ndarray) -> Any:
    """A tensor of a numeric numpy array, sharing its memory unless the array is read-only or reversed."""
    if array.flags.writeable:
        try:
            return torch.from_numpy(array)
        except ValueError:  # negative strides (a reversed view): torch cannot view those
            pass
    return torch.from_numpy(np.array(array))  # arrays viewing Arrow memory are read-only; torch needs writable memory


def stack_values(values: list[Any]) -> Any | None:
    """One tensor from equal-shaped arrays or tensors (as torch's default collate stacks them), else None."""
    if not values:
        return None
    if all(isinstance(v, np.ndarray) for v in values):
        first = values[0]
        if first.dtype.kind in _LIST_KINDS or any(v.shape != first.shape or v.dtype != first.dtype for v in values):
            return None
        return torch.from_numpy(np.stack(values))
    if all(isinstance(v, torch.Tensor) for v in values):
        first = values[0]
        if any(v.shape != first.shape or v.dtype != first.dtype for v in values):
            return None
        return torch.stack(values)
    return None


def pad_values(name: str, values: list[Any], padding_value: Any) -> tuple[Any, Any]:
    """``(padded, mask)``: the arrays in one zero-padded tensor and a bool tensor marking the real elements.

    Raises:
        TorchTypeError: the values are not all arrays/tensors of numbers with the same number of dimensions.
    """
    tensors = []
    for value in values:
        if isinstance(value, np.ndarray):
            if value.dtype.kind in _LIST_KINDS:
                raise TorchTypeError(f'field {name!r}: cannot pad arrays of {value.dtype} into a tensor')
            value = to_tensor(value)
        if not isinstance(value, torch.Tensor):
            raise TorchTypeError(f'field {name!r}: padding needs arrays, got a {type(value).__name__}')
        tensors.append(value)
    if len({t.dim() for t in tensors}) > 1:
        raise TorchTypeError(f'field {name!r}: cannot pad arrays with different numbers of dimensions '
                             f'({sorted({tuple(t.shape) for t in tensors})})')
    dims = tensors[0].dim()
    shape = tuple(max(t.shape[d] for t in tensors) for d in range(dims))
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    padded = torch.full((len(tensors), *shape), padding_value, dtype=dtype)
    mask = torch.zeros((len(tensors), *shape), dtype=torch.bool)
    for i, t in enumerate(tensors):
        region = (i, *(slice(0, n) for n in t.shape))
        padded[region] = t
        mask[region] = True
    return padded, mask


def is_list_value(value: Any) -> bool:
    """Values that stay Python objects in a batch (torch has no tensor type for them)."""
    return isinstance(value, (decimal.Decimal, str, bytes)) or (
        isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind in _LIST_KINDS)


def accelerator_available() -> bool:
    """True when pinned memory makes sense (an accelerator torch can copy to)."""
    accelerator = getattr(torch, 'accelerator', None)
    if accelerator is not None and hasattr(accelerator, 'is_available'):
        return bool(accelerator.is_available())
    return bool(torch.cuda.is_available())


def pin(value: Any) -> Any:
    """``value`` with every CPU tensor inside (dicts, lists, tuples) copied to pinned memory."""
    if isinstance(value, torch.Tensor):
        return value.pin_memory() if value.device.type == 'cpu' else value
    if isinstance(value, dict):
        return {k: pin(v) for k, v in value.items()}
    if isinstance(value, list):
        return [pin(v) for v in value]
    if isinstance(value, tuple):
        return type(value)(*(pin(v) for v in value)) if hasattr(value, '_fields') else tuple(pin(v) for v in value)
    return value


class TensorOps(ArrayOps):
    """Buffer operations for batched loaders: numpy columns with numpy kernels, tensors with torch kernels.

    On the CPU the batched loaders keep the reader's numpy columns (and the numpy views of tensors a
    ``transform_fn`` returns) and make tensors only of finished batches: numpy's gathers and copies run on the
    calling thread, while torch's would start intra-op threads that compete with the reader's workers. Columns
    on another device stay tensors there. Every chunk of a column must have the same dtype and row shape.
    """

    def __init__(self, device: Any = None) -> None:
        self.device = torch.device('cpu') if device is None else torch.device(device)

    def _index(self, index: np.ndarray, like: Any) -> Any:
        return torch.from_numpy(index).to(like.device)

    def concat(self, name: str, parts: list[Any]) -> Any:
        if any(is_nested(part) for part in parts):
            return concat_columns(parts)  # nested columns stay numpy until their batch is finished
        _check_same_layout(name, parts)
        if isinstance(parts[0], np.ndarray):
            return np.concatenate(parts)
        return torch.cat(parts)

    def take(self, array: Any, index: np.ndarray) -> Any:
        if is_nested(array):
            return take_column(array, index)
        if isinstance(array, np.ndarray):
            return array[index]
        return array.index_select(0, self._index(index, array))

    def move(self, array: Any, source: np.ndarray, target: np.ndarray) -> None:
        if isinstance(array, np.ndarray):
            array[target] = array[source]
        else:
            array.index_copy_(0, self._index(target, array), array.index_select(0, self._index(source, array)))

    def storage(self, name: str, like: Any, rows: int, old: Any | None, used: int) -> Any:
        if old is not None:
            _check_same_layout(name, [old, like])
        if isinstance(like, np.ndarray):
            new = np.empty((rows, *like.shape[1:]), dtype=like.dtype)
        else:
            new = torch.empty((rows, *like.shape[1:]), dtype=like.dtype, device=like.device)
        if old is not None and used:
            new[:used] = old[:used]
        return new

    def write(self, name: str, storage: Any, start: int, values: Any) -> Any:
        _check_same_layout(name, [storage, values])
        storage[start:start + len(values)] = values
        return storage


def as_numpy_view(tensor: Any) -> Any:
    """A numpy view of a CPU tensor when numpy has its dtype (the tensor itself otherwise)."""
    if isinstance(tensor, torch.Tensor) and tensor.device.type == 'cpu' and not tensor.requires_grad:
        try:
            return tensor.numpy()
        except (TypeError, RuntimeError):
            return tensor
    return tensor


def batch_tensor(value: Any) -> Any:
    """The tensor of one column of a finished batch (numpy slices become tensors here)."""
    return to_tensor(value) if isinstance(value, np.ndarray) else value


def _check_same_layout(name: str, arrays: list[Any]) -> None:
    first = arrays[0]
    for other in arrays[1:]:
        if type(other) is not type(first) or other.dtype != first.dtype or other.shape[1:] != first.shape[1:]:
            raise TorchTypeError(f'column {name!r} changes from {first.dtype} rows of shape {tuple(first.shape[1:])} '
                                 f'to {other.dtype} rows of shape {tuple(other.shape[1:])} between row groups; '
                                 f'batched loaders need one fixed dtype and shape per column (use DataLoader for '
                                 f'variable-shape fields)')
