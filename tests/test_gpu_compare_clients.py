"""`python -m benchmarks.gpu.compare_clients` at a tiny scale on CPU: specctl bench and SGLang's
own client (`sglang.bench_serving` from the SGLang 0.5.23 wheel in .venv-sglang, run by
tests/sglang/bench_serving_cpu.py with stand-ins for triton, torchvision and `datasets` only)
against one served simulator, which records what each client sent."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import sglang_venv
from ports import free_ports

from benchmarks.gpu.compare_clients import FIGURES, Row, main, render
from benchmarks.gpu.tokenizer import build_tokenizer

ROOT = Path(__file__).resolve().parents[1]
SGLANG_PYTHON = sglang_venv.PYTHON
needs_sglang_client = sglang_venv.needs("sglang", "torch")
KEY = "k"




def test_the_relative_difference_is_specctl_over_sglang() -> None:
    assert Row(1, "tok_per_s", 90.0, 100.0).relative == pytest.approx(-0.1)
    assert Row(1, "ttft_p50_ms", 5.0, None).relative is None
    assert "-10.0%" in render([Row(1, "tok_per_s", 90.0, 100.0)])


@pytest.mark.parametrize("sim_server", [{"admin_key": KEY, "speedup": 10, "record": True}],
                         indirect=True)  # fmt: skip
@needs_sglang_client
def test_both_clients_send_the_same_prompts_at_the_same_depth(sim_server, tmp_path: Path) -> None:
    tok = tmp_path / "tok"
    build_tokenizer(tok)
    out = tmp_path / "cmp"
    sglang_cmd = f"{shlex.quote(str(SGLANG_PYTHON))} " \
                 f"{shlex.quote(str(ROOT / 'tests' / 'sglang' / 'bench_serving_cpu.py'))}"
    code = main([
        "--url", sim_server.base_url, "--admin-key", KEY, "--concurrency", "2",
        "--num-prompts", "6", "--input-tokens", "24", "--output-tokens", "8", "--out", str(out),
        "--tokenizer", str(tok), "--sglang-cmd", sglang_cmd, "--depth", "2",
    ])  # fmt: skip
    assert code == 0, [p.read_text()[-2000:] for p in out.glob("*.log")]
    doc = json.loads((out / "compare.json").read_text())
    assert doc["depth"] == 2 and doc["exact_input_tokens"] is True
    rows = doc["rows"]
    assert [(r["concurrency"], r["figure"]) for r in rows] == [
        (2, f) for f in FIGURES
    ]
    assert all(r["specctl"] and r["sglang"] and r["relative"] is not None for r in rows)
    prompts = {json.loads(line)["conversations"][0]["value"]
               for line in (out / "prompts.jsonl").read_text().splitlines()}  # fmt: skip
    assert len(prompts) == 6
    # a request cancelled at a level's end before the server read its body has none
    sent = [body for path, body in sim_server.posts
            if path == "/v1/completions" and body is not None]
    ours = [b for b in sent if "stream_options" in b]  # specctl bench asks for usage per chunk
    theirs = [b for b in sent if "best_of" in b]  # SGLang's client sends best_of
    assert len(ours) + len(theirs) == len(sent)
    for client in (ours, theirs):
        assert {b["prompt"] for b in client} == prompts  # every prompt, and no other
        assert all(b["ignore_eos"] is True for b in client)
        measured = [b for b in client if b["max_tokens"] == 8]
        assert len(measured) >= 6  # the level sent every prompt at 8 output tokens
    # Both ran at depth 2: every push forced it (the last restored the released table).
    pushes = [b for path, b in sim_server.posts if path == "/set_internal_state"]
    forced = [p for p in pushes if p and "specctl_t0_depth" in json.dumps(p)]
    assert forced and all('"specctl_t0_depth": 2' in json.dumps(p) for p in forced)
    assert sim_server.server.specctl_state()["table"] is None  # released again at the end


@needs_sglang_client
def test_the_harness_compare_step_runs_both_clients_at_each_level(tmp_path: Path) -> None:
    """`python -m benchmarks.gpu setup compare stop --backend sim`: the step runs the two
    clients once per --compare-concurrency level, --compare-waves requests a stream, and
    gathers their figures into compare/compare.json (stand-in servers: `specctl sim serve`)."""
    spec_port, plain_port = free_ports(2)
    run_dir = tmp_path / "run"
    sglang_cmd = f"{shlex.quote(str(SGLANG_PYTHON))} " \
                 f"{shlex.quote(str(ROOT / 'tests' / 'sglang' / 'bench_serving_cpu.py'))}"
    done = subprocess.run(
        [sys.executable, "-m", "benchmarks.gpu", "setup", "compare", "stop", "--tiny",
         "--backend", "sim", "--sim-speedup", "20", "--run-dir", str(run_dir),
         "--spec-port", str(spec_port), "--plain-port", str(plain_port),
         "--compare-concurrency", "1,3", "--compare-waves", "2", "--compare-min-requests", "3",
         "--compare-sglang-cmd", sglang_cmd],
        cwd=ROOT, capture_output=True, text=True, timeout=240, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    doc = json.loads((run_dir / "compare" / "compare.json").read_text())
    assert sorted(doc["levels"]) == ["1", "3"]
    for level, requests in (("1", 3), ("3", 6)):
        assert set(doc["levels"][level]) == set(FIGURES)
        assert all(v["specctl"] and v["sglang"] for v in doc["levels"][level].values())
        prompts = (run_dir / "compare" / f"c{level}" / "prompts.jsonl").read_text()
        assert len(prompts.splitlines()) == requests


def test_sglang_client_lets_its_dataset_registry_import_without_datasets() -> None:
    """SGLang 0.5.17's client imports `from datasets import load_dataset` at start: with the
    package missing, the runner's placeholder takes the import and names the fix when called."""
    from benchmarks.gpu.sglang_client import _MissingDatasets

    placeholder = _MissingDatasets("datasets")
    load_dataset = placeholder.load_dataset  # what `from datasets import load_dataset` reads
    with pytest.raises(RuntimeError, match=r"`datasets` is not installed.*custom"):
        load_dataset("MMMU/MMMU")
    with pytest.raises(AttributeError):
        _ = placeholder.__path__  # not a package: import machinery looks no further
