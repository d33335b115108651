"""The one channel of user-facing status: Python logging through the `genforge` logger (`console()`), which every
layer writes to and an application may route elsewhere."""

from __future__ import annotations

import logging
import sys


class StatusFormatter(logging.Formatter):
    """"genforge: <message>", and "genforge: warning: <message>" for warnings."""

    def format(self, record: logging.LogRecord) -> str:
        warning = "warning: " if record.levelno == logging.WARNING else ""
        return f"genforge: {warning}{record.getMessage()}"


class StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a line is emitted (a test runner or a caller may swap it)."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(StatusFormatter())

    @property
    def stream(self):  # type: ignore[override]
        return sys.stderr

    @stream.setter
    def stream(self, value: object) -> None:
        """StreamHandler sets a stream; this one has none of its own."""


def console() -> logging.Logger:
    """The `genforge` logger, the one channel of user-facing status (progress lines, resume and fallback notes,
    warnings, summaries): plain lines on stderr (`StatusFormatter`), unless the application configured logging
    itself (a handler on it or on the root logger)."""
    logger = logging.getLogger("genforge")
    if not logger.handlers and not logging.getLogger().handlers:
        status_on_stderr()
    return logger


def status_on_stderr() -> None:
    """Status lines on stderr whatever else logging does (the command line: its output is for a person)."""
    logger = logging.getLogger("genforge")
    if not any(isinstance(handler, StderrHandler) for handler in logger.handlers):
        logger.addHandler(StderrHandler())
    logger.setLevel(logging.INFO)
