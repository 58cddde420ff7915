"""Short texts for the reprs of readers and loaders: a URL (or a list of them) and a list of field names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

#: Field names shown before the rest is summarized as a count.
MAX_NAMES_SHOWN = 8


def describe_urls(url_or_urls: Any) -> str:
    """``'file:///a'``, or ``'file:///a' (+2 more files)`` for a list; passwords in URLs are hidden."""
    from petastorm.fs import display_url

    if isinstance(url_or_urls, (list, tuple)):
        if not url_or_urls:
            return '[]'
        first = repr(display_url(str(url_or_urls[0])))
        return first if len(url_or_urls) == 1 else f'{first} (+{len(url_or_urls) - 1} more)'
    return repr(display_url(str(url_or_urls)))


def describe_names(names: Iterable[str], limit: int = MAX_NAMES_SHOWN) -> str:
    """``[id, image, label]``, or ``[a, b, ..., h, +5 more]`` past ``limit`` names."""
    names = list(names)
    shown = ', '.join(names[:limit])
    if len(names) > limit:
        shown += f', +{len(names) - limit} more'
    return f'[{shown}]'
