"""README's snippets run as shown: its Python blocks, and its `python -m sim` commands that need
no run directory, cost file or benchmark (those take minutes or a measured run). A command shown
after `$ ` with its output must print exactly that output."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from sim.__main__ import main

README = Path(__file__).resolve().parents[1] / "README.md"
# Commands that need what a fresh checkout lacks (a run, a calibration, a cost file) or the
# planner's slow searches (`sim plan`, tested in tests/test_planner_*.py).
NEEDS_MORE = ("runs/", "costs.json", "calibrate", "--measured")


def python_blocks(text: str) -> list[str]:
    """The fenced ```python blocks."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def sim_commands(text: str) -> list[tuple[str, list[str] | None]]:
    """Each indented `python -m sim ...` line (joined over trailing backslashes, comments cut),
    with the output lines shown under it when it is written `$ python -m sim ...` (else None)."""
    lines = text.splitlines()
    found = []
    i = 0
    while i < len(lines):
        match = re.match(r"^    (\$ )?python -m sim (.*)$", lines[i])
        i += 1
        if not match:
            continue
        command = match.group(2)
        while command.endswith("\\"):
            command = command[:-1] + lines[i].strip()
            i += 1
        command = command.split("  #")[0].strip()
        output = None
        if match.group(1):
            output = []
            while i < len(lines) and lines[i].startswith("    ") and not lines[i].startswith("    $ "):
                output.append(lines[i][4:])
                i += 1
        found.append((command, output))
    return found


TEXT = README.read_text()
COMMANDS = [(c, out) for c, out in sim_commands(TEXT)
            if not c.startswith("plan ") and not any(word in c for word in NEEDS_MORE)]


def test_the_extraction_finds_the_snippets() -> None:
    # Guards the test itself: the quick start's command and the figure commands are among them.
    commands = [c for c, _ in COMMANDS]
    assert "compare" in commands and "figures" in commands
    assert any(c.startswith("plot --compare") for c in commands)
    assert len(python_blocks(TEXT)) >= 2


@pytest.mark.parametrize("block", python_blocks(TEXT), ids=lambda b: b.splitlines()[1][:40])
def test_python_block_runs(block: str, tmp_path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    exec(compile(block, "README.md", "exec"), {"__name__": "__readme__"})


@pytest.fixture(scope="module")
def shell_dir(tmp_path_factory) -> Path:
    """One working directory for all commands, run in README order (a later one may read what
    an earlier one wrote, as a reader following the README would)."""
    return tmp_path_factory.mktemp("readme")


@pytest.mark.parametrize("command,output", COMMANDS, ids=[c[:50] for c, _ in COMMANDS])
def test_sim_command_runs_and_prints_what_readme_shows(command, output, shell_dir, monkeypatch, capsys) -> None:
    monkeypatch.chdir(shell_dir)
    code = main(shlex.split(command))
    captured = capsys.readouterr()
    assert code == 0, captured.err
    if output is not None:
        assert [line.rstrip() for line in captured.out.rstrip("\n").splitlines()] == output


def test_runtime_help_states_the_defaults(capsys) -> None:
    from runtime.cli import parser

    with pytest.raises(SystemExit):
        parser().parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    for option, default in (("--hidden HIDDEN", "512"), ("--seed SEED", "0"), ("--steps STEPS", "10"),
                            ("--timeout TIMEOUT", "300.0"), ("--model {mlp,gpt}", "mlp")):
        after = text.rsplit(option, 1)[1]  # the help entry, after the usage line
        assert f"(default: {default})" in after.split(" --", 1)[0], option
