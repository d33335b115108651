"""One trainer per run directory: an exclusive `fcntl.flock` on `RUN_DIR/.lock`, held by the process that writes the
run for as long as it trains. The kernel releases it when that process ends, however it ends (kill -9 included), so
a stale lock never blocks; the file keeps the holder's host, pid and start time for the message a second trainer
gets. Readers (`genforge sample`, `eval`) do not take it."""

from __future__ import annotations

import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK_FILE = ".lock"


class RunDirectoryLocked(ValueError):
    """Another process is training into this run directory (the CLI exits 2)."""


def _holder(path: Path) -> str:
    """'host H, pid P, since T' of the lock's holder, as it wrote them (or 'unknown' while it is writing them)."""
    try:
        info = json.loads(path.read_text() or "{}")
        return f"host {info['host']}, pid {info['pid']}, since {info['started']}"
    except (OSError, ValueError, KeyError, TypeError):
        return "holder unknown"


class RunLock:
    """The held lock of a run directory; `release` (or the end of the process) frees it."""

    def __init__(self, fd: int, path: Path) -> None:
        self.fd, self.path = fd, path

    @classmethod
    def acquire(cls, run_dir: Path) -> "RunLock":
        """Take the lock of `run_dir` (created if missing) without waiting; RunDirectoryLocked naming the holder
        when another process has it."""
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / LOCK_FILE
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirectoryLocked(f"{run_dir} is in use by another `genforge train` ({_holder(path)}): two "
                                     "trainers would corrupt each other's checkpoints and logs. Wait for it to end, "
                                     "or train into another directory (--run-dir DIR, or --fresh)") from None
        info = {"host": socket.gethostname(), "pid": os.getpid(),
                "started": time.strftime("%Y-%m-%d %H:%M:%S %z")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode(), 0)
        return cls(fd, path)

    def release(self) -> None:
        """Free the lock (idempotent)."""
        if self.fd >= 0:
            fcntl.flock(self.fd, fcntl.LOCK_UN)
            os.close(self.fd)
            self.fd = -1


def is_locked(run_dir: Path) -> bool:
    """Whether a process holds the lock of `run_dir` now."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing releases a lock this call took
    return False
