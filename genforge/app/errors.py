"""What ends a genforge command with a message instead of a traceback, and with which exit status: an error of the
user's input (a config, a file, a checkpoint that cannot be read, a locked run directory, bad data: exit 2) or of a
run that could not go on (too many non-finite steps, a checkpoint that could not be written: exit 1); a preempted
run exits with its own status (`Preempted.exit_code`)."""

from __future__ import annotations

from genforge.core.errors import ConfigError
from genforge.data.base import BadDataError
from genforge.data.shards import DataError
from genforge.engine.checkpoint import CheckpointError, CheckpointReadError
from genforge.engine.lock import RunDirectoryLocked
from genforge.engine.preemption import Preempted
from genforge.engine.trainer import TrainingError

__all__ = ["BAD_INPUT", "RUN_FAILED", "CheckpointError", "CheckpointReadError", "ConfigError", "Preempted",
           "TrainingError"]

BAD_INPUT = (CheckpointReadError, RunDirectoryLocked, BadDataError, DataError, ConfigError)  # exit 2
RUN_FAILED = (TrainingError, CheckpointError)  # exit 1 (CheckpointReadError, a subclass, is caught as input first)
