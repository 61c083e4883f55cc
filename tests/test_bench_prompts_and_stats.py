"""What a bench sends and reports beyond tok/s: prompts sized in the model's tokens, the
random-ids and generated-shared-prefix datasets, seeds, latency statistics, input and total
throughput, and repeats with confidence intervals (real HTTP against served simulators)."""

from __future__ import annotations

import csv
import importlib
import json
import math
import statistics
from pathlib import Path

import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers
from typer.testing import CliRunner

from benchmarks.gpu.tokenizer import build_tokenizer
from controller.bench.latency import latency_summary
from controller.bench.loadgen import RequestResult
from controller.bench.prompts import (
    WORDS,
    SharedPrefix,
    random_id_prompts,
    shared_prefix_prompts,
    synthetic_prompts,
)
from controller.bench.repeats import ci95_half_width, merge
from controller.bench.sweep import LevelResult
from controller.bench.tokenizer import load_tokenizer
from controller.cli import COMMAND_MODULES, app

for _module in COMMAND_MODULES:
    importlib.import_module(_module)

KEY = "k"


def flat(text: str) -> str:
    return " ".join(text.split())


@pytest.fixture(scope="module")
def bpe_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer trained here on the bench's words: words split into several
    tokens and merge across a cut, as a served model's tokenizer does."""
    tok = HFTokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>", "<s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())  # fmt: skip
    tok.train_from_iterator([" ".join(WORDS)] * 20 + ["Request 12: System 3: Question 7:"],
                            trainer)  # fmt: skip
    path = tmp_path_factory.mktemp("bpe") / "tokenizer.json"
    tok.save(str(path))
    return path


def test_prompts_are_cut_to_the_size_asked_in_the_models_tokens(bpe_path: Path) -> None:
    tok = load_tokenizer(str(bpe_path))
    prompts = synthetic_prompts(20, 100, 8, seed=3, tokenizer=tok)
    assert [tok.count(p.text) for p in prompts] == [100] * 20
    assert len({p.text for p in prompts}) == 20 and prompts[0].text.startswith("Request 0:")
    # Without a tokenizer a word counts as one: this BPE splits them, so that is approximate.
    rough = synthetic_prompts(20, 100, 8, seed=3)
    assert statistics.fmean(tok.count(p.text) for p in rough) > 110


def test_a_folder_with_tokenizer_json_is_read_too(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    tok = load_tokenizer(str(tmp_path))
    assert tok.count("the model speculates") == 3 and tok.special_ids  # [UNK], <s>, </s>


def test_random_ids_have_the_size_asked_and_no_special_tokens(bpe_path: Path) -> None:
    tok = load_tokenizer(str(bpe_path))
    prompts = random_id_prompts(10, 64, 8, seed=1, tokenizer=tok)
    assert all(p.ids is not None and len(p.ids) == 64 for p in prompts)
    assert not {i for p in prompts for i in p.ids or ()} & tok.special_ids
    assert all(p.completion_prompt() == list(p.ids or ()) for p in prompts)
    assert prompts[0].text == tok.decode(prompts[0].ids or ())  # for the chat endpoint
    bare = random_id_prompts(10, 64, 8, seed=1)
    assert all(1000 <= i < 32000 for p in bare for i in p.ids or ())


def test_shared_prefix_groups_share_their_system_prompt_in_a_shuffled_order(bpe_path) -> None:  # type: ignore[no-untyped-def]
    tok = load_tokenizer(str(bpe_path))
    shape = SharedPrefix(groups=3, prompts_per_group=4, system_tokens=40, question_tokens=10,
                         output_tokens=16)  # fmt: skip
    prompts = shared_prefix_prompts(shape, seed=2, tokenizer=tok)
    systems = [p.system for p in prompts]
    assert len(prompts) == 12 and len(set(systems)) == 3
    assert all(systems.count(s) == 4 for s in set(systems))
    assert systems != sorted(systems, key=systems.index)  # groups interleave
    assert all(tok.count(s or "") == 40 for s in systems)
    assert all(tok.count(p.text) == 10 and p.output_tokens == 16 for p in prompts)
    first = prompts[0]
    assert first.completion_prompt() == f"{first.system}\n\n{first.text}"
    assert first.messages() == [{"role": "system", "content": first.system},
                                {"role": "user", "content": first.text}]  # fmt: skip


def test_the_same_seed_gives_the_same_prompts_and_another_seed_others(bpe_path) -> None:  # type: ignore[no-untyped-def]
    tok = load_tokenizer(str(bpe_path))
    for make in (
        lambda seed: synthetic_prompts(5, 30, 8, seed=seed, tokenizer=tok),
        lambda seed: random_id_prompts(5, 30, 8, seed=seed),
        lambda seed: shared_prefix_prompts(SharedPrefix(2, 2, 20, 5, 8), seed=seed),
    ):
        assert make(7) == make(7) and make(7) != make(8)


def _request(ttft: float, tokens: int, e2e: float) -> RequestResult:
    gaps = tuple([(e2e - ttft) / (tokens - 1)] * (tokens - 1))
    return RequestResult(0.0, e2e, ttft, e2e, tokens, True, chunk_gaps_s=gaps)


def test_latency_statistics_are_mean_std_and_the_percentiles_asked() -> None:
    done = [_request(0.01 * (i + 1), 11, 0.1 + 0.01 * i) for i in range(10)]
    stats = latency_summary(done, (50, 95, 99.9))
    ttft = stats["ttft"]
    assert set(ttft) == {"mean", "std", "p50", "p95", "p99.9"}
    assert ttft["mean"] == pytest.approx(55.0) and ttft["p50"] == pytest.approx(55.0)
    assert ttft["std"] == pytest.approx(statistics.pstdev([10.0 * (i + 1) for i in range(10)]))
    assert ttft["p95"] == pytest.approx(95.5) and ttft["p99.9"] <= 100.0
    assert stats["e2e"]["mean"] == pytest.approx(145.0)
    assert latency_summary([], (50,))["tpot"] == {"mean": None, "std": None, "p50": None}


def _level(tok_s: float, ttft: float, **kw) -> LevelResult:  # type: ignore[no-untyped-def]
    return LevelResult(
        series="d1", depth=1, concurrency=4, requests=10, errors=0, elapsed_s=5.0,
        output_tok_per_s=tok_s, ttft_p50_ms=ttft, ttft_p90_ms=ttft, tpot_p50_ms=2.0,
        tpot_p90_ms=2.0, mean_batch=4.0, accept_length=1.6, client_cpu_share=0.1,
        latency_ms={"ttft": {"mean": ttft, "p50": ttft}}, **kw,
    )  # fmt: skip


def test_repeats_merge_into_means_with_a_students_t_interval() -> None:
    runs = [_level(100.0, 10.0), _level(110.0, 12.0), _level(120.0, 14.0, too_short=False)]
    merged = merge(runs)
    assert merged.output_tok_per_s == pytest.approx(110.0) and merged.repeats == 3
    assert merged.requests == 30 and merged.elapsed_s == pytest.approx(15.0)
    # t(0.975, 2) = 4.303, s = 10: 4.303 * 10 / sqrt(3)
    assert merged.ci95["output_tok_per_s"] == pytest.approx(4.3027 * 10 / math.sqrt(3), rel=1e-3)
    assert merged.ci95["ttft.mean"] == pytest.approx(4.3027 * 2 / math.sqrt(3), rel=1e-3)
    assert merged.latency_ms["ttft"]["p50"] == pytest.approx(12.0)
    assert merged.repeat_tok_per_s == (100.0, 110.0, 120.0)
    assert ci95_half_width([1.0]) is None and merge(runs[:1]) is runs[0]


def test_bench_reports_statistics_throughputs_and_the_servers_prompt_count(
    sim_server_factory, tmp_path: Path
) -> None:
    """random-ids go as ids, so the simulator counts exactly the size asked; --repeats 2 runs
    each level twice; the latency table, bench.json and bench.csv carry the statistics."""
    spec = sim_server_factory(admin_key=KEY, speedup=100)
    out = tmp_path / "b"
    res = CliRunner().invoke(app, [
        "bench", "--url", spec.base_url, "--admin-key", KEY, "--depths", "1", "--concurrency",
        "2", "--requests-per-level", "6", "--output-tokens", "16", "--dataset", "random-ids",
        "--prompt-tokens", "48", "--percentiles", "50,99.9", "--repeats", "2", "--seed", "5",
        "--client-bound-share", "100", "--out", str(out),
    ], env={"COLUMNS": "200"})  # fmt: skip
    assert res.exit_code == 0, res.output
    text = flat(res.output)
    assert ("prompts: random token ids below 32000 (no --tokenizer: give it to draw from the "
            "model's vocabulary), 48 prompt tokens (sent as token ids), 16 output tokens, "
            "seed 5") in text  # fmt: skip
    assert "each level 2 times" in text
    assert "latency (ms) per (depth, level): mean ±std, then p50 / p99.9" in text
    assert "prompt tokens as the servers counted them (their usage, mean per level): 48, for 48 "\
        "asked" in text
    assert "mean of 2 repeats ± 95% confidence interval" in text
    report = json.loads((out / "bench.json").read_text())
    assert report["percentiles"] == [50.0, 99.9] and report["repeats"] == 2
    assert report["seed"] == 5 and report["endpoint"] == "completions"
    (row,) = report["results"]
    assert row["repeats"] == 2 and len(row["repeat_tok_per_s"]) == 2
    assert set(row["latency_ms"]) == {"ttft", "tpot", "itl", "e2e"}
    assert set(row["latency_ms"]["tpot"]) == {"mean", "std", "p50", "p99.9"}
    assert "output_tok_per_s" in row["ci95"] and "ttft.p50" in row["ci95"]
    assert row["prompt_tokens"] == pytest.approx(48.0)
    # Input throughput: the window's prompts (48 tokens each) per second, about 3 prompt tokens
    # per output token here (48 in, 16 out per request, in a closed loop).
    assert row["input_tok_per_s"] == pytest.approx(3 * row["output_tok_per_s"], rel=0.35)
    assert row["total_tok_per_s"] == pytest.approx(
        row["input_tok_per_s"] + row["output_tok_per_s"], rel=1e-3)
    (line,) = csv.DictReader((out / "bench.csv").open())
    assert float(line["tpot_p99.9_ms"]) >= float(line["tpot_p50_ms"]) > 0
    assert line["output_tok_per_s_ci95"] and line["repeat_tok_per_s"].count(";") == 1
