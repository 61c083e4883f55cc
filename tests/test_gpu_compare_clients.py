"""`python -m benchmarks.gpu.compare_clients` at a tiny scale on CPU: specctl bench and SGLang's
own client (`sglang.bench_serving` from the SGLang 0.5.23 wheel in .venv-sglang, run by
tests/sglang/bench_serving_cpu.py with stand-ins for triton, torchvision and `datasets` only)
against one served simulator, which records what each client sent."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from benchmarks.gpu.compare_clients import FIGURES, Row, main, render
from benchmarks.gpu.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = ROOT / ".venv-sglang" / "bin" / "python"
KEY = "k"


def test_the_relative_difference_is_specctl_over_sglang() -> None:
    assert Row(1, "tok_per_s", 90.0, 100.0).relative == pytest.approx(-0.1)
    assert Row(1, "ttft_p50_ms", 5.0, None).relative is None
    assert "-10.0%" in render([Row(1, "tok_per_s", 90.0, 100.0)])


@pytest.mark.slow
@pytest.mark.skipif(not SGLANG_PYTHON.exists(), reason="needs .venv-sglang (scripts/test.sh)")
@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 10, "record": True}],
                         indirect=True)  # fmt: skip
def test_both_clients_send_the_same_prompts_at_the_same_depth(sim_server, tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    build_tokenizer(tok)
    out = tmp_path / "cmp"
    sglang_cmd = f"{shlex.quote(str(SGLANG_PYTHON))} " \
                 f"{shlex.quote(str(ROOT / 'tests' / 'sglang' / 'bench_serving_cpu.py'))}"
    code = main([
        "--url", sim_server.base_url, "--admin-key", KEY, "--concurrency", "1,3",
        "--num-prompts", "6", "--input-tokens", "24", "--output-tokens", "8", "--out", str(out),
        "--tokenizer", str(tok), "--sglang-cmd", sglang_cmd, "--depth", "2",
    ])  # fmt: skip
    assert code == 0, [p.read_text()[-2000:] for p in out.glob("*.log")]
    doc = json.loads((out / "compare.json").read_text())
    assert doc["depth"] == 2 and doc["exact_input_tokens"] is True
    rows = doc["rows"]
    assert [(r["concurrency"], r["figure"]) for r in rows] == [
        (c, f) for c in (1, 3) for f in FIGURES
    ]
    assert all(r["specctl"] and r["sglang"] and r["relative"] is not None for r in rows)
    prompts = {json.loads(line)["conversations"][0]["value"]
               for line in (out / "prompts.jsonl").read_text().splitlines()}  # fmt: skip
    assert len(prompts) == 6
    sent = [body for path, body in sim_server.posts if path == "/v1/completions"]
    ours = [b for b in sent if "stream_options" in b]  # specctl bench asks for usage per chunk
    theirs = [b for b in sent if "best_of" in b]  # SGLang's client sends best_of
    assert len(ours) + len(theirs) == len(sent)
    for client in (ours, theirs):
        assert {b["prompt"] for b in client} == prompts  # every prompt, and no other
        assert all(b["ignore_eos"] is True for b in client)
        measured = [b for b in client if b["max_tokens"] == 8]
        assert len(measured) >= 2 * 6  # each level sent every prompt at 8 output tokens
    # Both ran at depth 2: every push forced it (the last restored the released table).
    pushes = [b for path, b in sim_server.posts if path == "/set_internal_state"]
    forced = [p for p in pushes if p and "specctl_t0_depth" in json.dumps(p)]
    assert forced and all('"specctl_t0_depth": 2' in json.dumps(p) for p in forced)
    assert sim_server.server.specctl_state()["table"] is None  # released again at the end
