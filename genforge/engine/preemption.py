"""Stopping cleanly when asked: SIGTERM (schedulers, torchrun), SIGINT (Ctrl-C) and SIGUSR1 (SLURM's
`--signal=USR1@<seconds>` warning before a time limit). The trainer finishes the current step, every rank
agrees, a checkpoint is written, and the process exits with 128 + the signal number (143, 130, 138) so
that job scripts can tell preemption from failure. A second Ctrl-C interrupts at once.
"""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType, TracebackType

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1)


class Preempted(Exception):
    """The run stopped on a signal after writing `checkpoint`; exit with `exit_code`."""

    def __init__(self, signum: int, step: int, checkpoint: Path | None) -> None:
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        self.exit_code = 128 + signum
        name = signal.Signals(signum).name
        super().__init__(f"stopped by {name} after step {step}; checkpoint {checkpoint}; "
                         "run the same command again to resume")


class StopRequests:
    """While active, the stop signals are recorded in `signum` instead of killing the process."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._previous: dict[int, object] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signum is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt  # second Ctrl-C: the user means it
        self.signum = self.signum or signum

    def __enter__(self) -> "StopRequests":
        if threading.current_thread() is threading.main_thread():  # handlers can only be set there
            for sig in STOP_SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, exc_type: type | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
