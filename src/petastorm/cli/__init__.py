"""What the command-line tools share.

Progress on stderr, one-line errors, exit codes, ``--version`` and ``--storage-options``.

Every tool exits with:

* 0 when the work was done;
* 1 (:data:`EXIT_FAILED`) when the data or the work failed: a store that is not a Parquet dataset, unreadable
  files, missing or mismatched metadata, a failed Spark job, a storage error while working;
* 2 (:data:`EXIT_USAGE`) when the command line is wrong, found before any work starts: an unknown flag or a bad
  value (argparse's own errors), a malformed URL or one where nothing exists, a target that exists without
  ``--overwrite-output``, or names (field regexes, ``--not-null-fields``, ``--unischema_class``) that match
  nothing;
* 130 when interrupted (Ctrl-C).

An error is one line on stderr, ``PROG: error: MESSAGE``, followed for exit code 1 by the kind of error in
parentheses, e.g. ``(PetastormMetadataError)``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any, NoReturn

from petastorm import __version__
from petastorm.errors import PetastormError
from petastorm.fs import resolve_url

__all__ = [
    'EXIT_FAILED', 'EXIT_USAGE', 'STORAGE_OPTIONS_HELP', 'UsageError', 'add_storage_options_argument',
    'add_version_argument', 'check_target', 'configure_progress_logging', 'error_label', 'existing_directory',
    'existing_path', 'fail', 'one_line', 'parse_storage_options', 'progress_logging', 'run',
]

#: Exit codes: 1 when the work failed, 2 when the command line is wrong (argparse uses 2 as well).
EXIT_FAILED = 1
EXIT_USAGE = 2
_PROGRESS_HANDLER = '_petastorm_progress'


class UsageError(PetastormError, ValueError):
    """A command-line argument is wrong (reported with exit code 2)."""


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--version``, which prints ``PROG VERSION`` and exits with 0."""
    parser.add_argument('--version', action='version', version=f'%(prog)s {__version__}',
                        help='print the version of petastorm and exit')


def error_label(err: BaseException) -> str:
    """The kind of error shown after a failure's message.

    The exception's class name, or, for an error carried back from another process, the class name of the
    original (its ``error_type`` attribute).
    """
    return getattr(err, 'error_type', None) or type(err).__name__


class _CurrentStderrHandler(logging.StreamHandler):
    """A stream handler writing to whatever ``sys.stderr`` is when a record is emitted.

    A tool run in-process (a script calling ``main``, a test capturing output) may replace and close
    ``sys.stderr`` after the handler was added; a handler holding the old stream would then fail on every record.
    """

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    @property
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass  # the stream is always the current sys.stderr


@contextlib.contextmanager
def progress_logging() -> Iterator[None]:
    """Show petastorm's progress messages on stderr while a tool runs, and leave logging as it was after.

    A tool's ``main`` called in-process (a script, a notebook, a test) must not leave a handler behind: later log
    records of the caller would be printed by it.
    """
    root = logging.getLogger('petastorm')
    handlers, level = list(root.handlers), root.level
    configure_progress_logging()
    try:
        yield
    finally:
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)


def configure_progress_logging() -> None:
    """Show petastorm's progress messages on stderr (Spark shows its own stage progress there too)."""
    root = logging.getLogger('petastorm')
    if any(getattr(h, _PROGRESS_HANDLER, False) for h in root.handlers):
        return  # a second call in the same process (tests, wrappers) must not duplicate every line
    handler = _CurrentStderrHandler()
    handler.setFormatter(logging.Formatter('%(asctime)s %(message)s', datefmt='%H:%M:%S'))
    setattr(handler, _PROGRESS_HANDLER, True)
    root.addHandler(handler)
    root.setLevel(logging.INFO)


def one_line(err: BaseException) -> str:
    """The error's message on one line, without the JVM stack trace pyspark may append."""
    message = str(err).split('JVM stacktrace:')[0]
    return ' '.join(message.split()) or type(err).__name__


def fail(prog: str, message: str, code: int) -> NoReturn:
    """Print ``prog: error: message`` on stderr and exit with ``code``."""
    print(f'{prog}: error: {message}', file=sys.stderr)
    raise SystemExit(code)


STORAGE_OPTIONS_HELP = (
    'options of the filesystem behind the URLs (credentials, endpoint...), as a JSON object '
    '(\'{"client_kwargs": {"endpoint_url": "http://127.0.0.1:9000"}}\'), as @FILE holding that JSON (keeps secrets '
    'out of the shell history), or as comma-separated key=value pairs (anon=true,endpoint_url=http://...)')


def add_storage_options_argument(parser: argparse.ArgumentParser) -> None:
    """Add ``--storage-options`` (parsed by :func:`parse_storage_options`) to a tool's parser."""
    parser.add_argument('--storage-options', '--storage_options', dest='storage_options', metavar='OPTIONS',
                        default=None, help=STORAGE_OPTIONS_HELP)


def _pair_value(text: str) -> Any:
    # true/false/numbers/null become JSON values; anything else (a URL, a key) stays a string.
    try:
        return json.loads(text)
    except ValueError:
        return text


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """The ``storage_options`` dict a ``--storage-options`` value stands for (None when the flag is absent).

    The keys are checked against the URL's clients where the options are used (:func:`petastorm.fs.resolve_url`,
    which :func:`existing_path` and :func:`check_target` call before any work), so an unknown key is a usage error.

    Raises:
        UsageError: not a JSON object, an unreadable ``@FILE``, or a pair without ``=``.
    """
    if text is None:
        return None
    if text.startswith('@'):
        source = f'--storage-options file {text[1:]!r}'
        return _json_options(_read_options_file(text[1:], source), source)
    stripped = text.strip()
    if stripped.startswith('{'):
        return _json_options(stripped, '--storage-options')
    return _pair_options(stripped, '--storage-options')


def _read_options_file(path: str, source: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as err:
        raise UsageError(f'{source} cannot be read: {err.strerror}') from err
    except UnicodeDecodeError as err:
        # Only the position: the bytes themselves may be part of a secret.
        raise UsageError(f'{source} is not UTF-8 text (an invalid byte at position {err.start})') from err


def _json_options(text: str, source: str) -> dict[str, Any]:
    try:
        options = json.loads(text.strip())
    except json.JSONDecodeError as err:
        # The position is enough to find the mistake; the text itself may hold a secret.
        raise UsageError(f'{source} is not valid JSON ({err.msg} at character {err.pos})') from err
    if not isinstance(options, dict):
        raise UsageError(f'{source} must be a JSON object, got a JSON {type(options).__name__}')
    return options


def _pair_options(text: str, source: str) -> dict[str, Any]:
    options = {}
    for pair in filter(None, (p.strip() for p in text.split(','))):
        key, sep, value = pair.partition('=')
        if not sep:
            raise UsageError(f'{source} expects a JSON object or key=value pairs separated by commas; '
                             f'{key.strip()!r} has no "="')
        if not key.strip():
            # The value is not echoed: it may be a secret.
            raise UsageError(f'{source} expects a JSON object or key=value pairs separated by commas; '
                             f'a pair has an empty key')
        options[key.strip()] = _pair_value(value.strip())
    return options


def existing_path(url: str, what: str, storage_options: dict | None = None) -> Any:
    """Check that ``url`` parses and names an existing file or directory, before any work starts; its file info.

    Raises:
        UsageError: the URL has no scheme or an unknown scheme, or nothing exists there.
    """
    try:
        filesystem, path = resolve_url(url, storage_options)
        info = filesystem.get_file_info(path)
    except (ValueError, OSError) as err:
        raise UsageError(f'{what} {url!r}: {one_line(err)}') from err
    if info.type.name == 'NotFound' and any(c in path for c in '*?['):  # a glob: the files it matches
        from petastorm.store.listing import glob_files

        try:
            return filesystem.get_file_info(glob_files(filesystem, path, url)[0])
        except FileNotFoundError as err:
            raise UsageError(f'{what}: {one_line(err)}') from err
    if info.type.name == 'NotFound':
        raise UsageError(f'{what} {url} does not exist')
    return info


def existing_directory(url: str, what: str, storage_options: dict | None = None) -> None:
    """Check that ``url`` parses and names an existing directory, before any Spark work starts.

    Raises:
        UsageError: the URL has no scheme or unknown scheme, or nothing exists there, or it is not a directory.
    """
    if existing_path(url, what, storage_options).type.name != 'Directory':
        raise UsageError(f'{what} {url} is not a directory')


def check_target(url: str, overwrite: bool, storage_options: dict | None = None) -> None:
    """Check that ``url`` parses and, unless ``overwrite``, that nothing is there yet.

    Raises:
        UsageError: the URL is malformed, or the target exists and ``overwrite`` is False.
    """
    try:
        filesystem, path = resolve_url(url, storage_options)
        info = filesystem.get_file_info(path)
    except (ValueError, OSError) as err:
        raise UsageError(f'target {url!r}: {one_line(err)}') from err
    if info.type.name != 'NotFound' and not overwrite:
        raise UsageError(f'target {url} already exists; pass --overwrite-output to replace it')


def run(prog: str, work: Callable[[], None]) -> None:
    """Run a tool's work; turn failures into a one-line message and a non-zero exit code."""
    started = time.monotonic()
    try:
        work()
    except UsageError as err:
        fail(prog, str(err), EXIT_USAGE)
    except KeyboardInterrupt:
        fail(prog, 'interrupted', 130)
    except Exception as err:  # the tools' contract: any failure becomes one line and exit code 1
        fail(prog, f'{one_line(err)} ({error_label(err)})', EXIT_FAILED)
    logging.getLogger('petastorm.tools').info('done in %.1f s', time.monotonic() - started)
