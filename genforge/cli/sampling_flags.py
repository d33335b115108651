"""The sampling options of `genforge sample` / `genforge eval`, generated from their declaration: a typer option per
field of SampleOptions and of every registered family's options model (`with_sampling_flags`), and the help that
lists the common ones and those of the run's family (`SamplingCommand`)."""

from __future__ import annotations

import functools
import inspect
import typing
from typing import Annotated, Any, Callable, Optional

import typer
from typer.core import TyperCommand

from genforge.app.runs import SamplingOption, family_sample_options, run_family, sample_options

READ_METAVARS = {"image": "IMAGE", "video": "VIDEO", "lines": "FILE", "run": "RUN_DIR"}
FAMILIES_PANEL = "Options of the families (named in brackets)"


def option_parameter(option: SamplingOption) -> inspect.Parameter:
    """The typer option of a sampling option's field: `--name VALUE` (a bool: `--name/--no-name`), None when not
    given, its help the field's description (a family's option: and its families), under a help panel of its own."""
    types = [t for t in typing.get_args(option.field.annotation) or (option.field.annotation,) if t is not type(None)]
    kind = next((t for t in (bool, int, float) if t in types and not option.read), str)
    decls = [f"{option.flag}/--no-{option.flag[2:]}" if kind is bool else option.flag]
    panel, help_ = ("Sampling options", option.field.description) if option.common else (
        FAMILIES_PANEL, f"{option.field.description} [{', '.join(option.families)}]")
    info = typer.Option(*decls, help=help_, metavar=READ_METAVARS.get(option.read or ""), rich_help_panel=panel)
    return inspect.Parameter(option.name, inspect.Parameter.KEYWORD_ONLY, default=None,
                             annotation=Annotated[Optional[kind], info])


class SamplingFlags:
    """A command function (`sample`, `eval`) with the sampling options generated from the options models: its
    signature, of which typer makes the command's parameters, is the function's own plus a typer option per
    sampling option `command` takes (SampleOptions' fields and every registered family's: `runs.sample_options`),
    made each time typer builds the command; the function gets the options given as its `given` dict."""

    def __init__(self, function: Callable[..., None], command: str) -> None:
        functools.update_wrapper(self, function)
        self.function, self.command = function, command

    @property
    def __signature__(self) -> inspect.Signature:
        signature = inspect.signature(self.function, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "given"]
        return signature.replace(parameters=own + [option_parameter(o) for o in sample_options(self.command)])

    def __call__(self, **kwargs: Any) -> None:
        names = {option.name for option in sample_options(self.command)}
        given = {name: kwargs.pop(name) for name in names & set(kwargs)}
        self.function(**kwargs, given={name: value for name, value in given.items() if value is not None})


def with_sampling_flags(command: str) -> Callable[[Callable[..., None]], SamplingFlags]:
    """Decorator: the command function with the sampling options of `command` (`SamplingFlags`)."""
    return lambda function: SamplingFlags(function, command)


class SamplingCommand(TyperCommand):
    """`sample` and `eval`: with a run among the arguments, --help lists the common sampling options and those of
    the run's family only (without one: every family's, each naming its families)."""

    def parse_args(self, ctx: typer.Context, args: list[str]) -> list[str]:
        family = next((f for f in (run_family(a) for a in args if not a.startswith("-")) if f), None)
        options = {option.name: option for option in family_sample_options(self.name)}
        for param in self.params if family else ():
            option = options.get(param.name or "")
            if option is not None:
                param.hidden = family not in option.families
                param.help = option.field.description
                param.rich_help_panel = f"Options of {family!r} models"  # type: ignore[attr-defined]
        return super().parse_args(ctx, args)

    def format_options(self, ctx: typer.Context, formatter: Any) -> None:
        """The arguments, the command's own options, the common sampling options and the families', a section
        each (the options' help panels)."""
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            title = "Arguments" if param.param_type_name == "argument" else getattr(param, "rich_help_panel", None)
            if record is not None:
                sections.setdefault(title or "Options", []).append(record)
        for title, rows in sections.items():
            with formatter.section(title):
                formatter.write_dl(rows)
