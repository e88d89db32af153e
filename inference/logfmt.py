"""One log line format for every Quiver process: time, level, logger, message, then the record's ``extra`` fields as
``key=value`` pairs.

Quiver logs events as a short name plus fields (``logger.warning("agent.load_publish_failed", extra={"error": ...})``);
the standard formatter drops those fields, so a line said that something failed but not why. Django's ``LOGGING``
uses :class:`KeyValueFormatter`; the node agent, which runs without Django, calls :func:`configure` at start.
"""

from __future__ import annotations

import logging

# Attributes every LogRecord has (Python's logging module, 3.11 and 3.12); anything else came from ``extra``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime", "taskName"}
FORMAT = "%(asctime)s %(levelname)s %(name)s %(message)s"
_MAX_VALUE_CHARS = 500


class KeyValueFormatter(logging.Formatter):
    """``FORMAT``, then `` key=value`` for each ``extra`` field in the order given (values ``repr``-ed when they are
    not plain numbers or words, cut at 500 characters so one huge value cannot flood the log)."""

    def __init__(self, fmt: str | None = FORMAT, datefmt: str | None = None) -> None:
        super().__init__(fmt=fmt, datefmt=datefmt)

    def format(self, record: logging.LogRecord) -> str:
        """The standard line with the record's extra fields appended."""
        line = super().format(record)
        extras = [(k, v) for k, v in vars(record).items() if k not in _STANDARD and not k.startswith("_")]
        if not extras:
            return line
        return line + "".join(f" {k}={_value(v)}" for k, v in extras)


def _value(value: object) -> str:
    text = str(value) if isinstance(value, (int, float, bool)) else repr(value)
    if isinstance(value, str) and value.replace("_", "").replace("-", "").replace(".", "").isalnum():
        text = value
    return text if len(text) <= _MAX_VALUE_CHARS else text[:_MAX_VALUE_CHARS] + "…"


# HTTP client libraries that log every request at INFO ("HTTP Request: GET …/metrics 200"). The node agent reads the
# engine's /metrics every 100 ms and heartbeats every few seconds, so at INFO they wrote ~36,000 lines an hour on an
# idle node (attack-round finding, issue 30). Failures still reach the log: they raise, and the agent logs them.
# And uvicorn's access log, one line per request the agent serves: the Kubernetes readiness probe of /healthz every
# 5 s and Prometheus' scrape of /metrics every 15 s alone made ~960 an hour on an idle node; its own events (loads,
# evictions, refusals) the agent logs itself.
CHATTY_LOGGERS = ("httpx", "httpcore", "uvicorn.access")


def configure(level: str | int = logging.INFO) -> None:
    """Give the root logger one stderr handler with :class:`KeyValueFormatter` unless it already has handlers (a
    process configured elsewhere, or a test's capture). :data:`CHATTY_LOGGERS` log at WARNING and above whatever
    ``level`` is, unless ``level`` is DEBUG (tracing every request is then what was asked for)."""
    numeric = logging.getLevelName(level) if isinstance(level, str) else level
    if not isinstance(numeric, int) or numeric > logging.DEBUG:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
    root = logging.getLogger()
    if root.handlers:
        return
    handler = logging.StreamHandler()
    handler.setFormatter(KeyValueFormatter())
    root.addHandler(handler)
    root.setLevel(level)
