"""Every `genforge ...` command in the README's code blocks is one the CLI accepts: its command and every option it
names exist (`--help` appended, so nothing trains and a run that does not exist here is never opened; click answers
--help before it converts values, so a value's type is not checked here)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from genforge.cli import app

README = Path(__file__).resolve().parents[1] / "README.md"
runner = CliRunner()


def readme_commands(text: str) -> list[str]:
    """The `genforge` command lines of the ```bash blocks (a `$ ` prompt dropped, `\\` continuations joined,
    comments and output redirections cut)."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        for line in joined.splitlines():
            line = line.removeprefix("$ ").strip()
            if line.startswith("genforge "):
                words = shlex.split(line, comments=True)
                if ">" in words:
                    words = words[: words.index(">")]
                commands.append(shlex.join(words))
    return commands


COMMANDS = readme_commands(README.read_text())


def test_the_readme_has_commands_of_every_kind():
    kinds = {shlex.split(command)[1] for command in COMMANDS}
    assert {"train", "sample", "eval", "encode", "export", "presets", "data"} <= kinds, kinds


@pytest.mark.parametrize("command", COMMANDS)
def test_every_readme_command_parses(command):
    args = shlex.split(command)[1:]
    result = runner.invoke(app, [*args, "--help"], env={"COLUMNS": "100"})
    assert result.exit_code == 0, f"{command}\n{result.output}"


def test_every_benchmark_script_has_a_line_in_the_readme():
    text = README.read_text()
    scripts = sorted(p.name for p in (README.parent / "benchmarks").iterdir()
                     if p.suffix in (".py", ".sh") and p.name != "common.py")
    assert [name for name in scripts if f"| `{name}` |" not in text] == []
