"""Process-wide logging for ``epp serve``: text lines, or JSON objects as zap's json encoder writes them.

JSON lines carry ``level`` (zap's lower-case names), ``ts``, ``logger``, ``msg``, ``caller`` (``file:line``)
and, for records with an exception, ``error`` and ``stacktrace`` (the traceback). ``ts`` follows zap's time
encodings: ``iso8601`` (the reference's development default), ``rfc3339``, ``rfc3339nano``, ``epoch`` (seconds
as a float), ``millis`` or ``nano``. Log collectors that parse the reference's logs parse these.
"""

from __future__ import annotations

import datetime
import logging
import sys

import orjson

__all__ = ["configure_logging", "JsonFormatter", "TIME_ENCODINGS"]

TIME_ENCODINGS = ("iso8601", "rfc3339", "rfc3339nano", "epoch", "millis", "nano")
_ZAP_NAMES = {logging.DEBUG: "debug", logging.INFO: "info", logging.WARNING: "warn", logging.ERROR: "error",
              logging.CRITICAL: "fatal"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring)."""

    def __init__(self, time_encoding: str = "iso8601", worker: int | None = None) -> None:
        super().__init__()
        if time_encoding not in TIME_ENCODINGS:
            raise ValueError(f"unknown time encoding {time_encoding!r} ({', '.join(TIME_ENCODINGS)})")
        self.time_encoding = time_encoding
        self.worker = worker

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "level": _ZAP_NAMES.get(record.levelno, record.levelname.lower()),
            "ts": self._ts(record.created),
            "logger": record.name,
            "caller": f"{record.filename}:{record.lineno}",
            "msg": record.getMessage(),
        }
        if self.worker is not None:
            entry["worker"] = self.worker
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):  # an access-log line: its keys at the top level, not a JSON string in msg
            entry.update((k, v) for k, v in fields.items() if k not in entry)
            entry["msg"] = "access"
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = str(record.exc_info[1]) or type(record.exc_info[1]).__name__
            entry["stacktrace"] = self.formatException(record.exc_info)
        return orjson.dumps(entry, default=str).decode()

    def _ts(self, created: float) -> object:
        enc = self.time_encoding
        if enc == "epoch":
            return created
        if enc == "millis":
            return created * 1e3
        if enc == "nano":
            return int(created * 1e9)
        stamp = datetime.datetime.fromtimestamp(created, datetime.UTC)
        if enc == "iso8601":
            return stamp.strftime("%Y-%m-%dT%H:%M:%S.") + f"{stamp.microsecond // 1000:03d}Z"
        if enc == "rfc3339":
            return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
        return stamp.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def configure_logging(level: int, *, json: bool = False, time_encoding: str = "iso8601",
                      worker: int | None = None) -> None:
    """Send every logger's records at ``level`` and above to stderr, as JSON or as text lines (``worker``, when
    given, is named in each line). Replaces any handlers the root logger had."""
    handler = logging.StreamHandler(sys.stderr)
    if json:
        handler.setFormatter(JsonFormatter(time_encoding, worker))
    else:
        tag = "" if worker is None else f" w{worker}"
        handler.setFormatter(logging.Formatter(f"%(asctime)s{tag} %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
