"""`specctl --help` and every command's help load no heavy package (the learner's
scikit-learn and scipy, matplotlib): they import only when a command runs. How long start-up
takes is measured by benchmarks/cli_startup.py, not here."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("sklearn", "scipy", "matplotlib", "numpy", "httpx", "pydantic")

PROBE = f"""
import json, sys
from typer.testing import CliRunner
from controller.cli import load_commands
app = load_commands()
after_import = [m for m in {HEAVY!r} if m in sys.modules]
import typer
root = typer.main.get_command(app)
def walk(group, prefix):
    yield prefix
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from walk(cmd, [*prefix, name])
        else:
            yield [*prefix, name]
codes = [CliRunner().invoke(app, [*c, "--help"]).exit_code for c in walk(root, [])]
after_help = [m for m in {HEAVY!r} if m in sys.modules]
print(json.dumps({{"import": after_import, "help": after_help, "codes": codes}}))
"""


def test_import_and_every_help_page_load_no_heavy_package() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    doc = json.loads(proc.stdout.splitlines()[-1])
    assert len(doc["codes"]) >= 12 and set(doc["codes"]) == {0}
    assert doc["import"] == [], f"`import controller.cli` loads {doc['import']}"
    # typer itself needs pydantic to check `min=`/`max=` when it builds the commands.
    assert [m for m in doc["help"] if m != "pydantic"] == [], f"--help loads {doc['help']}"
