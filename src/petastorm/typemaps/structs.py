"""Arrow struct types as trees: the dotted paths of their leaves, and a struct pruned to some of its leaves.

A struct field of a Unischema (:func:`petastorm.unischema.struct_type_of_field`) is read leaf by leaf: reading the
Parquet paths of its leaves (``'st.a'``, ``'st.b.c'``) reads exactly the struct's fields its type names, which is
how a field selecting some leaves of a stored struct reads only them.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ['leaf_paths', 'pruned_struct']


def leaf_paths(prefix: str, struct: pa.StructType) -> list[str]:
    """The dotted paths of the leaves of ``struct``, each under ``prefix`` (``['st.a', 'st.b.c']`` for ``'st'``).

    A leaf is a child that is not a struct, or an empty struct; an empty ``struct`` has no leaves.
    """
    paths: list[str] = []
    for i in range(struct.num_fields):
        child = struct.field(i)
        path = f'{prefix}.{child.name}'
        if pa.types.is_struct(child.type) and child.type.num_fields:
            paths.extend(leaf_paths(path, child.type))
        else:
            paths.append(path)
    return paths


def pruned_struct(struct: pa.StructType, leaves: list[list[str]]) -> pa.StructType:
    """``struct`` holding only the given leaves (each a path of child names), in the struct's own order.

    A path that stops at a child keeps the whole child.
    """
    kept = []
    for i in range(struct.num_fields):
        child = struct.field(i)
        below = [path[1:] for path in leaves if path[0] == child.name]
        if not below:
            continue
        if any(not path for path in below) or not pa.types.is_struct(child.type):
            kept.append(child)
        else:
            kept.append(child.with_type(pruned_struct(child.type, below)))
    return pa.struct(kept)
