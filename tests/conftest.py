import logging
import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch.set_num_threads(min(2, torch.get_num_threads()))


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """Judge and other caches go to a per-session temp folder, never the user's home."""
    monkeypatch.setenv("GENFORGE_CACHE", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture
def status(caplog):
    """The user-facing status lines of the `genforge` logger (genforge.core.status), INFO and up: `status.text`,
    `status.messages`."""
    caplog.set_level(logging.INFO, logger="genforge")
    return caplog
