"""Longer-prompt family datasets for a bench at a second context length."""

from __future__ import annotations

import json

import pytest

from benchmarks.gpu.seeded import datasets


def _rows(n: int, words: int) -> list[dict[str, object]]:
    return [{"prompt": " ".join(f"w{i}_{j}" for j in range(words)), "output_tokens": 128}
            for i in range(n)]  # fmt: skip


def test_lengthen_keeps_rows_and_the_family_words():
    rows = _rows(4, 3)
    longer = datasets.lengthen(rows, 7)
    assert len(longer) == 4 and all(r["output_tokens"] == 128 for r in longer)
    assert all(len(str(r["prompt"]).split()) == 7 for r in longer)
    words = {w for r in rows for w in str(r["prompt"]).split()}
    assert all(set(str(r["prompt"]).split()) <= words for r in longer)
    # consecutive prompts continue through the pool rather than repeat the first one
    assert longer[0]["prompt"] != longer[1]["prompt"]


def test_cli_writes_the_file_and_names_bad_input(tmp_path, capsys):
    src = tmp_path / "family_a.jsonl"
    datasets.write_family(src, _rows(3, 4))
    out = tmp_path / "family_a_long.jsonl"
    assert datasets.main([str(src), str(out), "--words", "10"]) == 0
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["prompt"].split()) for r in lines] == [10, 10, 10]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "no prompt key"}\n')
    assert datasets.main([str(bad), str(out), "--words", "10"]) == 2
    assert 'bad.jsonl: every line needs a "prompt"' in capsys.readouterr().err
    assert datasets.main([str(tmp_path / "missing.jsonl"), str(out), "--words", "10"]) == 2


def test_spread_outputs_are_seeded_and_within_the_span(tmp_path, capsys):
    rows = _rows(200, 2)
    spread = datasets.spread_outputs(rows, 64, 192, seed=3)
    lengths = [r["output_tokens"] for r in spread]
    assert all(64 <= n <= 192 for n in lengths) and len(set(lengths)) > 50
    assert spread == datasets.spread_outputs(rows, 64, 192, seed=3)
    assert [r["prompt"] for r in spread] == [r["prompt"] for r in rows]
    src = tmp_path / "a.jsonl"
    datasets.write_family(src, rows)
    out = tmp_path / "b.jsonl"
    assert datasets.main([str(src), str(out), "--words", "5", "--output-tokens", "10:20"]) == 0
    assert "200 prompts of 5 words, output tokens 10-20" in capsys.readouterr().out
    assert datasets.main([str(src), str(out), "--output-tokens", "20:10"]) == 2
    assert "give 1 <= LOW <= HIGH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        datasets.main([str(src), str(out)])  # neither option
    assert "give --words N, --output-tokens LOW:HIGH, --fresh N, or several" in (
        capsys.readouterr().err)


def test_fresh_prompts_never_repeat_and_keep_the_family_words(tmp_path, capsys):
    family = datasets.fresh_prompts(_rows(20, 8), 5000, seed=1)  # 160 words, 8 a prompt
    assert len({r["prompt"] for r in family}) == 5000
    rows = [*_rows(3, 4), {"prompt": "w9_0 w9_1", "output_tokens": 7}]
    fresh = datasets.fresh_prompts(rows, 1000, seed=1)
    assert len(fresh) == 1000
    words = {w for r in rows for w in str(r["prompt"]).split()}
    assert all(set(str(r["prompt"]).split()) <= words for r in fresh)
    # each takes the length and output of the row it stands for, rows in turn
    assert [len(str(r["prompt"]).split()) for r in fresh[:5]] == [4, 4, 4, 2, 4]
    assert [r["output_tokens"] for r in fresh[:4]] == [128, 128, 128, 7]
    assert fresh == datasets.fresh_prompts(rows, 1000, seed=1)
    assert fresh != datasets.fresh_prompts(rows, 1000, seed=2)
    with pytest.raises(ValueError, match="give a count >= 1"):
        datasets.fresh_prompts(rows, 0)
    src, out = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    datasets.write_family(src, rows)
    assert datasets.main([str(src), str(out), "--fresh", "50", "--output-tokens", "10:20"]) == 0
    assert "50 prompts of their own words, freshly drawn, output tokens 10-20" in (
        capsys.readouterr().out)
    assert len(out.read_text().splitlines()) == 50
