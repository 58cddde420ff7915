"""What kind of Spark session the caller holds, and what we read from it: classic (py4j) or Spark Connect.

A classic ``pyspark.sql.SparkSession`` drives a JVM in this process: it has a ``sparkContext``, RDDs and the Hadoop
configuration. A Spark Connect session (``SparkSession.builder.remote('sc://...')``, Databricks shared and
serverless clusters, Spark 4 deployments) is a gRPC client: DataFrames, SQL confs and writes work, but every
attribute that reaches into the JVM raises deep inside pyspark. Everything here reads what both kinds offer
(``spark.conf``) and names the function when only a classic session can do it. pyspark is never imported.
"""

from __future__ import annotations

import logging
from typing import Any

from petastorm.errors import PetastormError

__all__ = [
    'ClassicSessionRequiredError', 'application_id', 'conf_value', 'connect_server_host', 'is_connect_session',
    'remote_connect_host', 'require_classic_session', 'spark_master',
]

logger = logging.getLogger(__name__)

_LOOPBACK_HOSTS = frozenset({'localhost', '127.0.0.1', '::1', '[::1]', '0.0.0.0'})


class ClassicSessionRequiredError(PetastormError, TypeError):
    """A Spark Connect session was given to a function that needs a classic SparkSession.

    Such functions use the session's JVM (RDDs, the Hadoop configuration), which a Connect client does not have.
    """


def is_connect_session(spark: Any) -> bool:
    """Whether ``spark`` (a SparkSession, or a DataFrame's ``sparkSession``) is a Spark Connect client."""
    return type(spark).__module__.startswith('pyspark.sql.connect')


def require_classic_session(spark: Any, function: str, instead: str) -> None:
    """Refuse a Spark Connect session in ``function``, saying what to use instead.

    Raises:
        ClassicSessionRequiredError: ``spark`` is a Spark Connect session.
    """
    if is_connect_session(spark):
        raise ClassicSessionRequiredError(
            f'{function} needs a classic SparkSession (one with a sparkContext and a JVM in this process); it was '
            f'given a Spark Connect session, which has neither. {instead}')


def conf_value(spark: Any, key: str) -> str | None:
    """The session's value of ``key``, or None when it is unset or the server does not let the client read it."""
    try:
        return spark.conf.get(key, None)
    except Exception as err:  # noqa: BLE001 - a Connect server may refuse some keys; the caller has a fallback
        logger.debug('could not read the Spark conf %s: %s', key, err)
        return None


def _context_or_conf(spark: Any, attribute: str, key: str) -> str | None:
    """``spark.sparkContext.<attribute>`` of a classic session, else the conf ``key`` (all a Connect client has)."""
    if not is_connect_session(spark):
        try:
            return getattr(spark.sparkContext, attribute)
        except Exception:  # noqa: BLE001 - a stand-in session object: fall back to the conf
            pass
    return conf_value(spark, key)


def spark_master(spark: Any) -> str | None:
    """The master URL (``local[2]``, ``yarn``, ``spark://...``), from the SparkContext or the session's conf."""
    return _context_or_conf(spark, 'master', 'spark.master')


def application_id(spark: Any) -> str | None:
    """The Spark application id, from the SparkContext or the session's conf."""
    return _context_or_conf(spark, 'applicationId', 'spark.app.id')


def connect_server_host(spark: Any) -> str | None:
    """The host of the Spark Connect server ``spark`` talks to; None for a classic session or when unknown."""
    if not is_connect_session(spark):
        return None
    try:
        return str(spark.client.host)
    except Exception:  # noqa: BLE001 - pyspark versions differ in where the endpoint is kept
        pass
    try:
        return str(spark._client._builder.host)
    except Exception:  # noqa: BLE001
        return None


def remote_connect_host(spark: Any) -> str | None:
    """The host of the Spark Connect server when it is another machine.

    None for a classic session, a server on loopback, or an unknown host. In ``local[*]`` mode the server's driver
    writes the cache files, so this decides what a local ``file://`` directory means.
    """
    host = connect_server_host(spark)
    return None if host is None or host.lower() in _LOOPBACK_HOSTS else host
