"""Short texts for messages and reprs: URLs with their passwords hidden, and lists of field names.

Every layer shows URLs (storage errors, reader reprs, cache logs), so hiding the password of a URL lives here,
at the bottom; :mod:`petastorm.fs` re-exports :func:`display_url`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

#: Field names shown before the rest is summarized as a count.
MAX_NAMES_SHOWN = 8

# ``scheme://user:password@`` anywhere in a text; the password is what we hide.
_URL_PASSWORD = re.compile(r'(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]*):[^@/\s]+@')


def hide_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:password@host``) replaced by ``***``."""
    return _URL_PASSWORD.sub(r'\g<head>:***@', text)


def display_url(url: str) -> str:
    """A URL as we show it in messages: any password in its user-info hidden."""
    return hide_url_passwords(url)


def describe_urls(url_or_urls: Any) -> str:
    """``'file:///a'``, or ``'file:///a' (+2 more)`` for a list; passwords in URLs are hidden."""
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


def counted(number: int, noun: str) -> str:
    """``'1 row group'``, ``'3 row groups'``: a count with its noun in the right number."""
    return f'{number} {noun}' if number == 1 else f'{number} {noun}s'
