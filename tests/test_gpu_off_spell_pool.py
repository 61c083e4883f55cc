"""`python -m benchmarks.gpu.seeded.off_spell_pool`: off-spell rounds pooled per setting, over
result files in the shape `acceptance --off-spell` writes (one of them checked in from the H200)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu.seeded import off_spell_pool

RUN18B = (Path(__file__).parents[1] / "benchmarks/results/gpu"
          / "h200-sglang-0.5.17-seeded-8b-run18b/acceptance")  # fmt: skip


def _round(path: Path, on: tuple[float, float], off: tuple[float, float]) -> Path:
    """A result file: (accept length, request steps) for each arm."""
    arms = {name: {"accept_length": a, "request_steps": steps, "requests": 8}
            for name, (a, steps) in (("on_throughout", on), ("off_then_on", off))}  # fmt: skip
    path.write_text(json.dumps({"off_spell": {"off_tokens": 64, "depth": 3, **arms}}))
    return path


def test_rounds_pool_as_tokens_over_steps(tmp_path: Path, capsys) -> None:
    a = _round(tmp_path / "a.json", on=(3.0, 100), off=(2.0, 100))
    b = _round(tmp_path / "b.json", on=(3.0, 300), off=(3.0, 100))
    out = tmp_path / "pooled.json"
    assert off_spell_pool.main(["--setting", "skip1", str(a), str(b), "--json", str(out)]) == 0
    [pooled] = json.loads(out.read_text())
    # on: 1200 tokens over 400 steps; off: 500 over 200, not the mean of 2.0 and 3.0 per round
    assert pooled["accept_length"] == {"on_throughout": 3.0, "off_then_on": 2.5}
    assert pooled["loss"] == 0.5 and pooled["loss_by_round"] == [1.0, 0.0]
    assert "| skip1 | 2 | 3.0000 | 2.5000 | +0.5000 | +1.000 +0.000 |" in capsys.readouterr().out


def test_a_measured_file_reads_back() -> None:
    pooled = off_spell_pool.pool("skip1", [RUN18B / "prefill_skip_1.json"])
    assert pooled.rounds == 1
    assert pooled.loss == pytest.approx(3.1569 - 3.2616)


def test_bad_files_and_arguments_are_named(tmp_path: Path, capsys) -> None:
    text = tmp_path / "out.txt"
    text.write_text("| family | depth |")
    assert off_spell_pool.main(["--setting", "skip1", str(text)]) == 2
    assert "out.txt: cannot read it as JSON" in capsys.readouterr().err
    unmeasured = _round(tmp_path / "none.json", on=(3.0, 100), off=(2.0, 100))
    data = json.loads(unmeasured.read_text())
    data["off_spell"]["off_then_on"]["accept_length"] = None  # requests ended before the push
    unmeasured.write_text(json.dumps(data))
    assert off_spell_pool.main(["--setting", "skip1", str(unmeasured)]) == 2
    assert "none.json: no measured off spell" in capsys.readouterr().err
    assert off_spell_pool.main(["--setting", "skip1"]) == 2
    assert "--setting skip1: give its files" in capsys.readouterr().err
