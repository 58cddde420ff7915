"""Arrow IPC entry files read through a private memory map, so that their columns are writable without a copy.

A table read through ``pyarrow.memory_map`` views the file read-only, and every numpy array made from it is
read-only: torch then copies each batch, and a transform that edits an image in place fails, where the same
reader without a cache gives writable arrays. Here the file is mapped copy-on-write (``MAP_PRIVATE``): the
arrays view the page cache until something writes to them, and a write changes a private copy of that page only,
never the file. The mapping lives as long as any array that views it.
"""

from __future__ import annotations

import mmap

import pyarrow as pa

# Types whose buffers are rebuilt over the writable mapping: everything made of fixed-width values, offsets and
# validity bitmaps. Other types (dictionaries, unions, views, run-end encoding) keep their read-only buffers.
_FLAT_KINDS = (pa.types.is_integer, pa.types.is_floating, pa.types.is_boolean, pa.types.is_temporal,
               pa.types.is_decimal, pa.types.is_fixed_size_binary, pa.types.is_binary, pa.types.is_large_binary,
               pa.types.is_string, pa.types.is_large_string, pa.types.is_null)
_NESTED_KINDS = (pa.types.is_list, pa.types.is_large_list, pa.types.is_fixed_size_list, pa.types.is_struct)


def read_mapped_table(path: str) -> pa.Table:
    """The table of the Arrow IPC file ``path``, its buffers viewing a copy-on-write mapping of the file.

    Raises:
        OSError: the file cannot be opened or mapped.
        ValueError: the file is empty or not an Arrow IPC file (``pyarrow.ArrowInvalid`` is a ValueError).
    """
    with open(path, 'rb') as file:
        memory = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY)
    view = memoryview(memory)
    source = pa.py_buffer(view)
    table = pa.ipc.open_file(pa.BufferReader(source)).read_all()
    start = source.address
    columns = [pa.chunked_array([_rebased(chunk, view, start) for chunk in column.chunks], type=column.type)
               for column in table.columns]
    return pa.Table.from_arrays(columns, schema=table.schema)


def _rebased(array: pa.Array, view: memoryview, start: int) -> pa.Array:
    """``array`` with each of its buffers replaced by a writable view of the same bytes of the mapping."""
    if isinstance(array.type, pa.BaseExtensionType):
        return pa.ExtensionArray.from_storage(array.type, _rebased(array.storage, view, start))
    if array.offset:
        return array  # arrays read from a file start at 0; a slice's children would need their own offsets
    if any(kind(array.type) for kind in _NESTED_KINDS):
        if pa.types.is_struct(array.type):
            children = [_rebased(array.field(i), view, start) for i in range(array.type.num_fields)]
        else:
            children = [_rebased(array.values, view, start)]
    elif any(kind(array.type) for kind in _FLAT_KINDS):
        children = None
    else:
        return array
    own = array.buffers()[:array.type.num_buffers]
    buffers = [_rebased_buffer(buffer, view, start) for buffer in own]
    return pa.Array.from_buffers(array.type, len(array), buffers, null_count=array.null_count, children=children)


def _rebased_buffer(buffer: pa.Buffer | None, view: memoryview, start: int) -> pa.Buffer | None:
    if buffer is None:
        return None
    offset = buffer.address - start
    if offset < 0 or offset + buffer.size > len(view):
        return buffer  # not in the file (the IPC reader made it, e.g. to align it): nothing to view
    return pa.py_buffer(view[offset:offset + buffer.size])
