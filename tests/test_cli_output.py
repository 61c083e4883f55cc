"""Output that a pipe, a file or a narrow terminal gets: every number whole, help wrapped once.

`COLUMNS=80 specctl ... | cat` is run for real (the console script in a subprocess, stdout a
pipe); the narrow-terminal case renders with a rich Console forced to act as a terminal.
"""

from __future__ import annotations

import io
import itertools
import json
import os
import re
import subprocess
import sys

import pytest
import typer
from rich.console import Console
from rich.table import Table

from controller.cli import load_commands
from controller.cli.tables import print_table

app = load_commands()

SWEEP = ["sim", "sweep", "--profile", "h200-llama8b-eagle3", "--concurrency", "1,16,256",
         "--duration", "40", "--warmup", "5"]  # fmt: skip


def specctl(*args: str, columns: int = 80) -> str:
    """stdout of the console script with stdout a pipe, as in `COLUMNS=80 specctl ... | cat`."""
    proc = subprocess.run(
        [sys.executable, "-m", "controller.cli", *args],
        capture_output=True, text=True, timeout=300,
        env={**os.environ, "COLUMNS": str(columns)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def shown(value: float, digits: int, text: str) -> bool:
    """`value` (rounded in the JSON) appears whole in `text` at `digits` decimals."""
    half = 0.5 * 10 ** -(digits + 1)
    forms = {f"{v:.{digits}f}" for v in (value - half, value, value + half)}
    return any(re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", text) for f in forms)


def test_sim_sweep_in_a_pipe_at_80_columns_shows_every_number_whole() -> None:
    text = specctl(*SWEEP)
    doc = json.loads(specctl(*SWEEP, "--json"))
    assert "…" not in text
    for row in doc["rows"]:
        assert shown(row["tok_per_s"], 1, text), (row, text)
        assert shown(row["step_ms"], 1, text), (row, text)
        if row["mode"] == "spec" and row["concurrency"] == 1:
            assert f"L={row['accept_length']:.2f}" in text
    for oracle in doc["oracle"]:
        assert shown(oracle["tok_per_s"], 1, text)


def _wide_table() -> Table:
    t = Table(title="wide", box=None)
    t.add_column("level", justify="right")
    for i in range(12):
        t.add_column(f"depth {i}\nL={1 + i / 10:.2f}", justify="right")
    for level in (1, 16, 256):
        t.add_row(str(level), *[f"{level * 1000 + i + 0.25:.2f}" for i in range(12)])
    return t


def _cells() -> list[str]:
    return [f"{level * 1000 + i + 0.25:.2f}" for level in (1, 16, 256) for i in range(12)]


def test_a_table_wider_than_a_pipe_prints_plain_rows_at_its_own_width() -> None:
    out = io.StringIO()
    print_table(Console(file=out, width=80), _wide_table())
    text = out.getvalue()
    assert "…" not in text and all(c in text for c in _cells())
    rows = [ln for ln in text.splitlines() if ln.strip().startswith(("1 ", "16 ", "256 "))]
    assert len(rows) == 3  # one line per row, longer than 80 columns
    assert all(len(r) > 80 for r in rows)


def test_a_table_wider_than_a_terminal_is_split_repeating_its_key_column() -> None:
    out = io.StringIO()
    print_table(Console(file=out, width=60, force_terminal=True, color_system=None), _wide_table())
    text = out.getvalue()
    assert "…" not in text and all(c in text for c in _cells())
    assert max(len(ln) for ln in text.splitlines()) <= 60
    assert text.count("level") >= 3  # each part keeps the key column


def _commands() -> list[list[str]]:
    root = typer.main.get_command(app)

    def walk(group, prefix):  # type: ignore[no-untyped-def]
        for name, cmd in group.commands.items():
            if hasattr(cmd, "commands"):
                yield from walk(cmd, [*prefix, name])
            else:
                yield [*prefix, name]

    return list(walk(root, []))


@pytest.mark.parametrize("command", _commands(), ids=" ".join)
def test_every_commands_help_has_examples_and_fits_80_columns(command: list[str]) -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [*command, "--help"], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(ln) for ln in lines) <= 80, "\n".join(ln for ln in lines if len(ln) > 80)
    examples = lines.index("  Examples:")
    assert lines[examples + 1].strip().startswith("specctl ")
    # Paragraphs are rewrapped once: no line stops short with its sentence going on below
    # (the double wrap left "keeps N" alone on a line).
    body = lines[2:examples]
    for this, below in itertools.pairwise(body):
        if this.strip() and below.strip():
            first_word = below.split()[0]
            assert len(this) + 1 + len(first_word) > 80 - 2, (this, below)


def test_the_command_list_is_not_cut() -> None:
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "80"})
    commands = result.output.split("Commands:")[1]
    assert "..." not in commands and "…" not in commands, commands
