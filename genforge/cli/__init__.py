"""genforge command line (`genforge`, `python -m genforge`): the commands (`commands`; `genforge ema` in
`ema_command`, `genforge fid` in `fid_command`) and the sampling flags they generate from the options models
(`sampling_flags`)."""

from genforge.cli import ema_command  # noqa: F401  (registers `genforge ema` on the app)
from genforge.cli import fid_command  # noqa: F401  (registers `genforge fid` on the app)
from genforge.cli.commands import app, main

__all__ = ["app", "main"]
