"""structlog set-up: JSON lines Cloud Logging understands (``severity``), or readable console."""

from __future__ import annotations

import logging
import sys

import structlog


def _severity(_, method_name: str, event_dict: dict) -> dict:
    level = event_dict.pop("level", method_name)
    event_dict["severity"] = {"warn": "WARNING", "exception": "ERROR"}.get(level, level.upper())
    return event_dict


def configure(*, json_logs: bool, level: str = "info") -> None:
    """JSON to stderr for machines (Cloud Logging agent, ray job logs); console for humans."""
    lvl = getattr(logging, level.upper(), logging.INFO)
    processors = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True, key="time"),
    ]
    if json_logs:
        processors += [_severity, structlog.processors.format_exc_info,
                       structlog.processors.EventRenamer("message"),
                       structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=False)]
    structlog.configure(processors=processors,
                        wrapper_class=structlog.make_filtering_bound_logger(lvl),
                        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
                        cache_logger_on_first_use=False)
