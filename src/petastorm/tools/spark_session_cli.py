"""Spark session options shared by the command-line tools.

``--master`` or ``--remote``, and ``--spark-session-config``.

Example::

    parser = argparse.ArgumentParser()
    add_configure_spark_arguments(parser)
    args = parser.parse_args()
    spark = configure_spark(SparkSession.builder.appName('my-tool'), args).getOrCreate()
"""

from __future__ import annotations

import argparse
from typing import Any

__all__ = ['add_configure_spark_arguments', 'configure_spark']

def add_configure_spark_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add ``--master``, ``--remote`` and ``--spark-session-config KEY=VALUE ...`` to ``parser``.

    Returns:
        ``parser``, for chaining.
    """
    group = parser.add_argument_group('Spark session')
    group.add_argument('--master', type=str, default=None,
                       help='Spark master URL, e.g. local[*] or yarn; the Spark default when omitted')
    group.add_argument('--remote', type=str, default=None, metavar='URL',
                       help='connect to a Spark Connect server instead of starting Spark here, e.g. '
                            'sc://host:15002 (the SPARK_REMOTE environment variable does the same)')
    group.add_argument('--spark-session-config', type=str, nargs='+', default=None, metavar='KEY=VALUE',
                       help='extra Spark settings, e.g. --spark-session-config spark.executor.memory=4g '
                            'spark.executor.cores=2')
    return parser


def _parse_pairs(pairs: list[str] | None) -> list[tuple[str, str]]:
    parsed = []
    for pair in pairs or []:
        key, sep, value = pair.partition('=')
        if not sep or not key.strip():
            raise ValueError(f'--spark-session-config expects key=value pairs, got {pair!r}')
        parsed.append((key.strip(), value))
    return parsed


def configure_spark(builder: Any, args: argparse.Namespace) -> Any:
    """Apply the parsed ``--master``/``--remote`` and ``--spark-session-config`` options to a builder.

    Args:
        builder: ``SparkSession.builder`` (or any object with ``master(url)``, ``remote(url)`` and
            ``config(key, value)``).
        args: the namespace parsed by a parser that :func:`add_configure_spark_arguments` extended.

    Returns:
        The builder.

    Raises:
        RuntimeError: ``args`` did not come from a parser extended by :func:`add_configure_spark_arguments`.
        ValueError: a ``--spark-session-config`` item is not ``key=value``, or both ``--master`` and ``--remote``
            were given.
    """
    if not hasattr(args, 'master') or not hasattr(args, 'spark_session_config'):
        raise RuntimeError('configure_spark() needs the options added by add_configure_spark_arguments(parser); '
                           'call it on the parser before parse_args()')
    pairs = _parse_pairs(args.spark_session_config)
    remote = getattr(args, 'remote', None)  # a namespace made before --remote existed has none
    if args.master and remote:
        raise ValueError(f'--master {args.master} and --remote {remote} are exclusive: a Spark Connect server has '
                         f'its own master; give one of them')
    if remote:
        builder = builder.remote(remote)
    if args.master:
        builder = builder.master(args.master)
    for key, value in pairs:
        builder = builder.config(key, value)
    return builder
