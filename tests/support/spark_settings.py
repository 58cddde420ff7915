"""Settings of the JVMs the Spark tests start: the session of the run and the Spark Connect server."""

from __future__ import annotations

# Only errors from the JVM: Spark's default profile prints several WARN lines per session.
LOG4J2_PROPERTIES = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""

# Test jobs are tiny: the quick JIT tier and the serial collector start the JVM in about half the time.
FAST_START_JVM_OPTIONS = '-XX:TieredStopAtLevel=1 -XX:+UseSerialGC'
