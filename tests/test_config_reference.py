"""docs/daemon-config.md is what `python -m controller.daemon.config_reference` prints now: the
configuration reference cannot drift from the pydantic models that validate `controller.yaml`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from controller.daemon.config import ControllerConfig, GuardrailConfig
from controller.daemon.config_reference import render_reference

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "daemon-config.md"
REGENERATE = "python -m controller.daemon.config_reference > docs/daemon-config.md"


def test_the_checked_in_reference_is_what_the_generator_prints() -> None:
    assert REFERENCE.read_text() == render_reference(), (
        f"docs/daemon-config.md is out of date with the config models; run `{REGENERATE}`"
    )


def test_the_module_prints_the_reference_on_stdout() -> None:
    out = subprocess.run([sys.executable, "-m", "controller.daemon.config_reference"],
                         capture_output=True, text=True, check=True, cwd=ROOT)  # fmt: skip
    assert out.stdout == render_reference()


def test_every_field_appears_with_its_default_and_bounds() -> None:
    text = render_reference()
    rows = {line.split("|")[1].strip(): line for line in text.splitlines()
            if line.startswith("| `")}  # fmt: skip
    for name in (*ControllerConfig.model_fields, *GuardrailConfig.model_fields):
        assert f"`{name}`" in rows, f"{name} missing from the reference"
    assert "`60.0`" in rows["`min_dwell_s`"] and ">= 0.0" in rows["`min_dwell_s`"]
    assert "in (0.0, 1.0]" in rows["`rollback_drop`"]
    assert "`server` \\| `prometheus`" in rows["`source`"]
    assert "required" in rows["`targets`"] and "(at least 1)" in rows["`targets`"]
    assert "## `learner`" in text and "`exploration_cap`" in rows


def test_a_new_field_shows_up_in_the_reference(monkeypatch) -> None:
    """A field added to a model changes what the generator prints, so the file check fails
    until the reference is regenerated."""
    from pydantic import Field, create_model

    from controller.daemon import config_reference

    extended = create_model(
        "GuardrailConfig", __base__=GuardrailConfig,
        on_exit=(str, Field("release", description="What to leave on the server at exit")),
    )  # fmt: skip
    section = Field(default_factory=lambda: extended())
    top = create_model("ControllerConfig", __base__=ControllerConfig,
                       guardrails=(extended, section))  # fmt: skip
    monkeypatch.setattr(config_reference, "ControllerConfig", top)
    text = config_reference.render_reference()
    assert "| `on_exit` | str | `release` | What to leave on the server at exit |" in text
    assert text != REFERENCE.read_text()
