"""JSON logs with a request id; nothing a patient sent ever goes into a log record.

Log calls in the service pass only identifiers, counts, rules and timings as `extra` fields;
payload values, demographics and caller ids are never logged, at any level.
"""

from __future__ import annotations

import json
import logging
import time
from contextvars import ContextVar
from typing import Any

request_id_var: ContextVar[str | None] = ContextVar("scehr_request_id", default=None)

#: Record attributes every LogRecord has; anything else came in through `extra=`.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime"}
#: What a line never shows: the standard attributes and uvicorn's colored copy of its message.
_NOT_EXTRA = frozenset(_STANDARD | {"color_message"})
#: One encoder for every line (`json.dumps` with an option builds a new one per call).
_ENCODE = json.JSONEncoder(default=str).encode


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, request_id and extras."""

    #: (second, its UTC text): a second's lines share the formatted part of their time.
    _second: tuple[int, str] = (-1, "")

    def _ts(self, record: logging.LogRecord) -> str:
        """The record's time as ISO 8601 UTC with milliseconds, its second formatted once."""
        second, text = self._second  # one read: threads share the formatter
        if second != int(record.created):
            second = int(record.created)
            text = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            self._second = (second, text)
        return f"{text}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": self._ts(record),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        rid = request_id_var.get()
        if rid is not None:
            out["request_id"] = rid
        for k, v in vars(record).items():
            if k not in _NOT_EXTRA and not k.startswith("_"):
                out[k] = v
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return _ENCODE(out)


_HANDLER_FLAG = "_scehr_handler"


#: Python warnings (numpy's RuntimeWarning, library deprecations) go to this logger once
#: captured, so that they reach the log stream as JSON lines instead of plain text.
WARNINGS_LOGGER = "py.warnings"


def configure_logging(level: str) -> None:
    """JSON handler on the `scehr` and Python-warnings loggers (idempotent; root left alone).

    Warnings are captured because a plain-text line in a JSON log stream breaks every log
    shipper that parses it; Python shows each warning once per code location, so they stay few.
    """
    for name in ("scehr", WARNINGS_LOGGER):
        logger = logging.getLogger(name)
        logger.setLevel(level)
        if not any(getattr(h, _HANDLER_FLAG, False) for h in logger.handlers):
            handler = logging.StreamHandler()
            handler.setFormatter(JsonFormatter())
            setattr(handler, _HANDLER_FLAG, True)
            logger.addHandler(handler)
        logger.propagate = False
    logging.captureWarnings(True)


def uvicorn_log_config(level: str) -> dict[str, Any]:
    """uvicorn's own loggers in the same JSON format (its access log is replaced by ours)."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {"json": {"()": "scehr.service.logs.JsonFormatter"}},
        "handlers": {"default": {"class": "logging.StreamHandler", "formatter": "json",
                                 "stream": "ext://sys.stderr"}},
        "loggers": {
            "uvicorn": {"handlers": ["default"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            WARNINGS_LOGGER: {"handlers": ["default"], "level": level, "propagate": False},
        },
    }
