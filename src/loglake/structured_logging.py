"""Structured logging for loglake: ``key=value`` text for people, JSON lines for machines.

Modules log with ``logging.getLogger(__name__)`` and pass fields through ``extra={"fields":
{...}}`` (or use ``log_event``); this module only decides the output shape.
"""

from __future__ import annotations

import json
import logging
import sys
import time


class _Formatter(logging.Formatter):
    def __init__(self, json_lines: bool) -> None:
        super().__init__()
        self.json_lines = json_lines

    def format(self, record: logging.LogRecord) -> str:
        fields = dict(getattr(record, "fields", {}) or {})
        if self.json_lines:
            out = {
                "ts": round(record.created, 6),
                "level": record.levelname.lower(),
                "logger": record.name,
                "msg": record.getMessage(),
                **fields,
            }
            if record.exc_info:
                out["exc"] = self.formatException(record.exc_info)
            return json.dumps(out, default=str)
        ts = time.strftime("%H:%M:%S", time.localtime(record.created))
        kv = " ".join(f"{k}={v}" for k, v in fields.items())
        line = f"{ts} {record.levelname.lower():7} {record.name}: {record.getMessage()}"
        if kv:
            line += " " + kv
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


def configure_logging(level: int = logging.INFO, json: bool = False) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_Formatter(json))
    root = logging.getLogger("loglake")
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False


def log_event(logger: logging.Logger, level: int, msg: str, **fields: object) -> None:
    logger.log(level, msg, extra={"fields": fields})
