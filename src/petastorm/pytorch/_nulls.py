"""The loaders' ``nulls`` option: what to do with the nulls of each field (refuse, mask, or fill in)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from petastorm.pytorch._tensors import TorchTypeError
from petastorm.unischema import Unischema

#: Key suffix of the bool tensor saying which values are not null (``nulls='mask'``).
VALID_SUFFIX = '_valid'
NULLS_HELP = ("pass nulls='mask' to the loader (values plus a '<field>_valid' bool tensor), nulls=<fill value> "
              "(e.g. nulls=0), or nulls={'<field>': 'mask' or a fill value} per field ('*': every other field)")

Policy = Any  # None (refuse), 'mask', or ('fill', value)


def _check_policy(name: str, value: Any) -> Policy:
    if value is None:
        return None
    if isinstance(value, str):
        if value != 'mask':
            raise ValueError(f"nulls for {name}: expected 'mask', a fill value or None, got {value!r}")
        return 'mask'
    if isinstance(value, (bool, int, float, np.generic)):
        return ('fill', value)
    raise ValueError(f"nulls for {name}: expected 'mask', a number to fill in, or None, got {value!r}")


@dataclass(frozen=True)
class NullOption:
    """The loaders' ``nulls`` argument, checked: what to do with the nulls of each field.

    Attributes:
        default: the policy of fields not named (None: refuse, 'mask', or ('fill', value)).
        by_field: policies by field name, struct leaf path (``'st.a'``) or list elements (``'ids[]'``).
    """

    default: Policy = None
    by_field: Mapping[str, Policy] = field(default_factory=dict)

    @classmethod
    def of(cls, nulls: Any, schema: Unischema) -> NullOption:
        """Check the ``nulls`` argument of a loader against its reader's schema.

        Raises:
            ValueError: an unknown policy, or a field name the schema does not have.
        """
        if isinstance(nulls, Mapping):
            unknown = [key for key in nulls if key != '*' and str(key).split('.')[0].split('[')[0] not in
                       schema.fields]
            if unknown:
                raise ValueError(f'nulls names {unknown}, which are not fields of the reader (fields: '
                                 f'{", ".join(schema.fields)})')
            return cls(_check_policy('every other field', nulls.get('*')),
                       {str(key): _check_policy(str(key), value) for key, value in nulls.items() if key != '*'})
        return cls(_check_policy('every field', nulls))

    def policy(self, path: str) -> Policy:
        """The policy of a field, struct leaf or list elements (``'ids[]'``).

        A field or leaf takes its own, else its nearest enclosing struct's, else the default. The elements of a
        list are masked only when named (``{'ids[]': 'mask'}``), so that ``nulls='mask'`` does not give every list
        a mask of its elements; a fill value given for every field fills them too.
        """
        if path.endswith('[]'):
            if path in self.by_field:
                return self.by_field[path]
            return self.default if isinstance(self.default, tuple) else None
        parts = path.split('.')
        for cut in range(len(parts), 0, -1):
            key = '.'.join(parts[:cut])
            if key in self.by_field:
                return self.by_field[key]
        return self.default


def null_error(path: str) -> TorchTypeError:
    # The first sentence is the original's.
    if path.endswith('[]') or '[].' in path:
        return TorchTypeError(f"Pytorch does not support nullable fields. Found None in {path} (an element of a "
                              f"list); pass nulls={{'{path}': 'mask'}} (values plus a bool tensor of the elements, "
                              f"JaggedTensor.values_valid) or nulls={{'{path}': <fill value>}}")
    return TorchTypeError(f'Pytorch does not support nullable fields. Found None in {path}; {NULLS_HELP}')
