"""genforge command line (`genforge`, `python -m genforge`): the commands (`commands`) and the sampling flags they
generate from the options models (`sampling_flags`)."""

from genforge.cli.commands import app, main

__all__ = ["app", "main"]
