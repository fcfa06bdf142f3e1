"""The log4j2 configuration of the test bed's Spark daemons (Connect servers, the cluster)."""

from __future__ import annotations

_TEMPLATE = """\
rootLogger.level = {level}
rootLogger.appenderRef.stdout.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.own.name = {own}
logger.own.level = info
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = warn
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
"""


def spark_log4j2(level: str, own: str) -> str:
    """Everything at `level` but the daemon's own logger `own` (its start, registrations,
    executors launched and lost: at INFO); Jetty at WARN, Hadoop's native-code notice off."""
    return _TEMPLATE.format(level=level, own=own)
