"""Longer-prompt family datasets for a bench at a second context length."""

from __future__ import annotations

import json

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
