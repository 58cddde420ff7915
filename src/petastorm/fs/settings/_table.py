"""What every cloud's ``storage_options`` share: a table of names and aliases, read once, unknown keys refused.

A cloud (:class:`Cloud`) is its URL schemes, a table of :class:`Setting` (each with the names a user may give it
and the name each table library gives it), the options whose value is a dict passed on whole (``client_kwargs``),
the names its fsspec client takes itself, and the names other libraries use for its settings (refused with the one
to use). :func:`read_options` reads a user's options against that table, once; the cloud's module turns the result
into its typed settings and each client's arguments.

Keys already in a table library's own form pass on to that library and no other: delta-rs's (upper case, or
``aws_``/``google_``/``azure_`` in front) and pyiceberg's (a ``.`` in the name, ``s3.endpoint``).
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urlparse

from petastorm._describe import display_url
from petastorm.errors import StorageOptionsError

__all__ = ['Cloud', 'ReadOptions', 'Setting', 'canonical_options', 'endpoint_parts', 'is_library_form',
           'library_form', 'library_options', 'parameter_names', 'read_options', 'refuse_unknown']

Library = Literal['delta', 'iceberg']
#: the prefixes of delta-rs's own lower-case option names (its upper-case ones are recognised by their case).
_DELTA_PREFIXES = ('aws_', 'google_', 'azure_')
_LIBRARY_FORMS = "delta-rs's options (AWS_..., aws_..., google_..., azure_...) and pyiceberg's properties (s3.*, ...)"


@dataclass(frozen=True)
class Setting:
    """One setting of a cloud: the names a user may give it, and the names of the table libraries.

    Attributes:
        field: the attribute of the cloud's settings object.
        names: the names accepted in ``storage_options``, the fsspec client's own first; ``'client_kwargs.x'`` is
            key ``x`` of the dict option ``client_kwargs``.
        delta: delta-rs's storage option, or None.
        iceberg: pyiceberg's file IO property, or None.
        what: a few words for messages ("the access key id").
    """

    field: str
    names: tuple[str, ...]
    delta: str | None = None
    iceberg: str | None = None
    what: str = ''


@dataclass(frozen=True)
class Cloud:
    """The ``storage_options`` of one cloud: its table, and the names its fsspec client takes itself.

    Attributes:
        client: the fsspec client's name, for messages (``'s3fs'``).
        settings: the table.
        dict_options: options whose value is a dict passed on whole; names like ``'client_kwargs.x'`` are read
            from them.
        client_names: the top-level names the fsspec client takes besides the table's, as far as known without
            importing it.
        more_client_names: the names the installed client takes (its signature), asked only for a name that
            ``client_names`` does not have.
        dict_names: for each dict option, the keys its consumer takes, or None when it is not checked.
        foreign: another library's name for a setting (pyarrow's ``endpoint_override``) -> what to write instead.
    """

    client: str
    settings: tuple[Setting, ...]
    dict_options: tuple[str, ...]
    client_names: frozenset[str]
    more_client_names: Callable[[], frozenset[str]]
    dict_names: Callable[[str], frozenset[str] | None]
    foreign: Mapping[str, str]

    def table_names(self) -> frozenset[str]:
        """The top-level names the table reads (aliases included) and the dict options."""
        return frozenset(name for s in self.settings for name in s.names if '.' not in name) | set(self.dict_options)


@dataclass(frozen=True)
class ReadOptions:
    """A user's options read against a cloud's table.

    Attributes:
        values: each setting's value by its field (settings not given are absent).
        dicts: the dict options without the keys the table read from them.
        client: the options only the fsspec client takes, as given.
        delta: the options in delta-rs's own form.
        iceberg: the options in pyiceberg's own form.
    """

    values: Mapping[str, Any]
    dicts: Mapping[str, Mapping[str, Any]]
    client: Mapping[str, Any]
    delta: Mapping[str, str]
    iceberg: Mapping[str, str]


def is_library_form(name: str, library: Library) -> bool:
    """Whether ``name`` is written as ``library`` names its options (delta-rs's case or prefix, pyiceberg's dot)."""
    if library == 'iceberg':
        return '.' in name
    return name.isupper() or name.startswith(_DELTA_PREFIXES)


def library_form(options: Mapping[str, Any] | None, library: Library) -> dict[str, str]:
    """The options already in ``library``'s own form, as strings."""
    return {name: str(value) for name, value in (options or {}).items() if is_library_form(name, library)}


def read_options(cloud: Cloud, options: Mapping[str, Any] | None, url: str) -> ReadOptions:
    """Read ``options`` against ``cloud``'s table; the one parser of every cloud.

    Raises:
        StorageOptionsError: a key no client takes, a dict option that is not a dict, or one setting given by two
            names with different values.
    """
    rest = _with_dicts_copied(cloud, dict(options or {}), url)
    values = {}
    for setting in cloud.settings:
        value = _take(setting, rest, url)
        if value is not None:
            values[setting.field] = value
    delta, iceberg = library_form(rest, 'delta'), library_form(rest, 'iceberg')
    for name in [*delta, *iceberg]:
        del rest[name]
    dicts = {name: rest.pop(name) for name in cloud.dict_options if name in rest}
    _check_names(cloud, rest, dicts, url)
    return ReadOptions(values, dicts, rest, delta, iceberg)


def _with_dicts_copied(cloud: Cloud, options: dict[str, Any], url: str) -> dict[str, Any]:
    """``options`` with each dict option copied (None as an empty dict), so that reading them changes nothing."""
    for name in cloud.dict_options:
        if name not in options:
            continue
        value = options[name]
        if value is not None and not isinstance(value, Mapping):
            raise StorageOptionsError(f'storage_options[{name!r}] for {display_url(url)} must be a dict, got '
                                      f'{type(value).__name__}')
        options[name] = dict(value or {})
    return options


def _pop(options: dict[str, Any], name: str) -> Any:
    """Take ``name`` out of the options (``'parent.key'``: key of the dict option ``parent``); None if absent."""
    parent, dot, key = name.partition('.')
    if not dot:
        return options.pop(name, None)
    inner = options.get(parent)
    return inner.pop(key, None) if isinstance(inner, dict) else None


def _take(setting: Setting, options: dict[str, Any], url: str) -> Any:
    """The value the options give ``setting`` under any of its names; its names are taken out of the options."""
    given = [(name, value) for name in setting.names if (value := _pop(options, name)) is not None]
    if not given:
        return None
    first_name, first = given[0]
    for name, value in given[1:]:
        if value != first:
            # The values are not shown: they may be credentials.
            raise StorageOptionsError(
                f'storage_options for {display_url(url)} give {setting.what or setting.field} twice with different '
                f'values, as {_shown(first_name)} and as {_shown(name)}: give one of them')
    return first


def _shown(name: str) -> str:
    parent, dot, key = name.partition('.')
    return f'{parent!r}[{key!r}]' if dot else repr(name)


def _check_names(cloud: Cloud, rest: dict[str, Any], dicts: Mapping[str, Mapping[str, Any]], url: str) -> None:
    """Refuse a top-level key, or a key of a dict option, that nothing takes."""
    known = cloud.table_names() | cloud.client_names
    if set(rest) - known:
        known |= cloud.more_client_names()
        refuse_unknown(rest, known, 'storage_options', url, client=cloud.client, foreign=cloud.foreign,
                       also=_LIBRARY_FORMS)
    for name, inner in dicts.items():
        if not inner:
            continue  # the table read every key (asking the consumer's names may import it: botocore, 0.6 s)
        accepted = cloud.dict_names(name)
        if accepted is not None:
            refuse_unknown(inner, accepted, f'storage_options[{name!r}]', url, client=cloud.client)


def refuse_unknown(names: Iterable[str], accepted: Iterable[str], where: str, url: str, *, client: str,
                   foreign: Mapping[str, str] | None = None, also: str = '') -> None:
    """Raise for the first of ``names`` not in ``accepted``, naming it, the closest accepted name and all of them.

    Args:
        names: the keys given.
        accepted: the keys that are taken.
        where: where the keys came from (``'storage_options'``, ``"storage_options['client_kwargs']"``).
        url: the URL the options are for.
        client: the client whose names the options are (``'s3fs'``), for messages.
        foreign: another library's name -> what to write instead.
        also: what else is accepted, in words.

    Raises:
        StorageOptionsError: a key is not accepted.
    """
    accepted = sorted(set(accepted))
    unknown = sorted(name for name in names if name not in accepted)
    if not unknown:
        return
    name = unknown[0]
    instead = (foreign or {}).get(name)
    if instead is not None:
        hint = f"{name!r} is pyarrow's name; {where} are {client}'s names: write {instead} instead"
    else:
        close = difflib.get_close_matches(name, accepted, n=1)
        hint = f'did you mean {close[0]!r}?' if close else f'not a name {client} takes'
    more = f'; {also} pass on to those libraries' if also else ''
    raise StorageOptionsError(f'{where} for {display_url(url)} has the key {name!r}, which no client of the URL '
                              f'takes ({hint}). Accepted: {", ".join(accepted)}{more}')


def parameter_names(*functions: Callable[..., Any]) -> tuple[frozenset[str], bool]:
    """The keyword names the functions take, and whether any of them takes any keyword (``**kwargs``)."""
    names: set[str] = set()
    open_ended = False
    for function in functions:
        try:
            parameters = inspect.signature(function).parameters.values()
        except (TypeError, ValueError):  # a builtin without a signature: nothing is known of it
            open_ended = True
            continue
        for parameter in parameters:
            if parameter.kind is parameter.VAR_KEYWORD:
                open_ended = True
            elif parameter.kind is not parameter.VAR_POSITIONAL and parameter.name != 'self':
                names.add(parameter.name)
    return frozenset(names), open_ended


def fsspec_class_names(cls: type, *more: Callable[..., Any]) -> frozenset[str]:
    """The keyword names an fsspec filesystem class takes: its classes' ``__init__``, fsspec's listings cache's
    and ``more``'s."""
    import fsspec.dircache

    inits = [c.__dict__['__init__'] for c in cls.__mro__ if '__init__' in c.__dict__ and c is not object]
    return parameter_names(*inits, fsspec.dircache.DirCache.__init__, *more)[0]


def canonical_options(settings: Sequence[Setting], values: Mapping[str, Any],
                      dicts: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The settings under their fsspec client's names (each setting's first name), the dict options merged in."""
    options: dict[str, Any] = {name: dict(inner) for name, inner in dicts.items() if inner}
    for setting in settings:
        if setting.field not in values:
            continue
        parent, dot, key = setting.names[0].partition('.')
        if dot:
            options.setdefault(parent, {})[key] = values[setting.field]
        else:
            options[parent] = values[setting.field]
    return options


def library_options(settings: Sequence[Setting], values: Mapping[str, Any], library: Library) -> dict[str, str]:
    """The settings a table library has a name for, as its strings (a flag that is set is ``'true'``)."""
    options = {}
    for setting in settings:
        name = getattr(setting, library)
        value = values.get(setting.field)
        if name is not None and value:
            options[name] = 'true' if value is True else str(value)
    return options


def endpoint_parts(endpoint: str) -> tuple[str, str] | None:
    """An endpoint URL as pyarrow's clients take it: its scheme and ``host:port``; None when it has a path or query.

    pyarrow's S3, GCS and Azure clients take the scheme and the authority apart and nothing else, so an endpoint with
    a path (a proxy's prefix) stays with the fsspec client, which takes the whole URL.
    """
    parsed = urlparse(endpoint)
    if parsed.scheme not in ('http', 'https') or not parsed.netloc or parsed.path not in ('', '/') or parsed.query:
        return None
    return parsed.scheme, parsed.netloc
