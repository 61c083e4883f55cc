"""The GPU harness's model folders, tokenizer and options, without SGLang (real files, the
real `tokenizers` package)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from tokenizers import Tokenizer

from benchmarks.gpu import harness
from benchmarks.gpu.model_folders import (
    LLAMA_8B,
    TINY,
    ModelFolderError,
    TargetShape,
    build_dummy_folders,
    check_given_folders,
    target_config,
)
from benchmarks.gpu.options import OptionError, Options, resolve, validate
from benchmarks.gpu.tokenizer import (
    EOS,
    bench_words,
    build_tokenizer,
    encode_words,
    vocabulary,
    word_id,
)
from controller.bench.prompts import synthetic_prompts


def test_dummy_folders_have_the_llama8b_shape_and_an_eagle3_head(tmp_path):
    folders = build_dummy_folders(tmp_path, LLAMA_8B)
    target = json.loads((tmp_path / "target-llama8b" / "config.json").read_text())
    draft = json.loads((tmp_path / "eagle3-llama8b" / "config.json").read_text())
    assert folders.dummy and folders.kind == "dummy-llama8b"
    assert (target["hidden_size"], target["num_hidden_layers"], target["vocab_size"]) == \
        (4096, 32, 128256)
    assert target["architectures"] == ["LlamaForCausalLM"]
    assert draft["architectures"] == ["LlamaForCausalLMEagle3"]
    assert (draft["num_hidden_layers"], draft["draft_vocab_size"]) == (1, 32000)
    assert draft["hidden_size"] == target["hidden_size"]
    tok_config = json.loads((tmp_path / "target-llama8b" / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    # The folders it returns pass the same check a given folder must pass.
    assert check_given_folders(tmp_path / "target-llama8b", tmp_path / "eagle3-llama8b").target \
        == folders.target


def test_tiny_shape_is_small_but_deep_enough_for_eagle3():
    config = target_config(TINY)
    assert config["num_hidden_layers"] >= 7 and config["hidden_size"] <= 512
    with pytest.raises(ValueError, match="at least 7 layers"):
        target_config(TargetShape("shallow", 256, 512, 4, 4, 4, 64))


def test_tokenizer_round_trip_one_token_per_word(tmp_path):
    build_tokenizer(tmp_path)
    tok = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    words = list(bench_words())
    enc = tok.encode(" ".join(words))
    assert len(enc.ids) == len(words) and enc.ids == encode_words(words)
    assert tok.decode(enc.ids) == " ".join(words)
    # Position does not change a word's id, and the ids are those of a fresh build.
    assert tok.encode("server model").ids == [word_id("server"), word_id("model")]
    assert tok.encode("Model").ids == [word_id("model")]
    assert word_id(EOS) == 2 and len(vocabulary()) == len(set(vocabulary()))
    # The bench's synthetic prompts tokenize without unknowns, digits one token each.
    prompt = synthetic_prompts(1, 40, 8)[0].text
    ids = tok.encode(prompt).ids
    assert 0 not in ids and len(ids) == len(prompt.split()) + 1  # "0:" is two tokens
    # Ids beyond the vocabulary (a random model emits them) decode to nothing.
    assert tok.decode([word_id("the"), 100_000, word_id("model")]) == "the model"
    with pytest.raises(KeyError, match="not in the harness vocabulary"):
        word_id("antidisestablishmentarianism")


def test_given_folders_are_checked_with_the_option_named(tmp_path):
    target, draft = tmp_path / "t", tmp_path / "d"
    target.mkdir()
    draft.mkdir()
    with pytest.raises(ModelFolderError, match=r"--target .*no config\.json"):
        check_given_folders(target, draft)
    (target / "config.json").write_text(json.dumps(target_config(TINY)))
    (draft / "config.json").write_text(json.dumps(target_config(TINY)))
    with pytest.raises(ModelFolderError, match=r"--target .*tokenizer"):
        check_given_folders(target, draft)
    build_tokenizer(target)
    with pytest.raises(ModelFolderError, match=r"--draft .*EAGLE-3"):
        check_given_folders(target, draft)


def test_options_layer_defaults_tiny_saved_and_explicit():
    opts = resolve({}, {})
    assert (opts.shape, opts.switches, opts.bench_concurrency) == ("llama8b", 1000,
                                                                   "1,4,16,64,128")
    tiny = resolve({"tiny": True}, {"switches": 7})
    assert (tiny.shape, tiny.switches, tiny.level_seconds) == ("tiny", 7, 2.0)
    # A saved option beats the preset; this command's beats both.
    assert resolve({"tiny": True, "level_seconds": 5.0}, {}).level_seconds == 5.0
    assert resolve({"tiny": True, "level_seconds": 5.0}, {"level_seconds": 3.0}) \
        .level_seconds == 3.0
    # An option the harness no longer has, saved by an older run, is passed over.
    assert resolve({"bench_duration": 5.0}, {}) == Options()


@pytest.mark.parametrize(("explicit", "message"), [
    ({"target": "/x"}, "--target and --draft go together"),
    ({"switch_depths": "0,7"}, "--switch-depths: depth 7 is not in --depths"),
    ({"switch_depths": "0"}, "expected two depths"),
    ({"mem_fraction_first": 1.5}, "--mem-fraction-first"),
    ({"bench_concurrency": "1,x"}, "--bench-concurrency: expected comma-separated integers"),
    ({"backend": "vllm"}, "--backend"),
    ({"depths": "1,3"}, "--greedy-switch-depths: depth 0 is not in --depths"),
    ({"off_path": "skip-extend"}, "--off-path: expected specctl or sglang"),
    ({"parity_order": "random"}, "--parity-order: expected alternate or spec-first or "
                                 "plain-first"),
    ({"output_spread": "192:64"}, "--output-spread: expected LOW:HIGH with 1 <= LOW <= HIGH"),
    ({"parity_streams": "0,4"}, "--parity-streams: every value must be >= 1"),
    ({"parity_tag": "a/b"}, "--parity-tag: letters, digits"),
    ({"bench_cpus": "99999"}, "--bench-cpus: core 99999 is not available"),
    ({"trace_phases": "5:2"}, "--trace-phases item 1 '5:2': write seconds:concurrency:dataset"),
    ({"trace_policies": "static:2"}, "--trace-policies: static:2 needs depth 2 in --depths"),
    ({"trace_policies": "greedy"}, "--trace-policies 'greedy': use daemon, sglang"),
    ({"trace_datasets": "a=x.jsonl"}, "--trace-datasets: the trace uses dataset 'b'"),
    ({"acceptance_depths": "2"}, "--acceptance-depths: depth 2 is not in --depths"),
    ({"level_seconds": 0.0}, "--level-seconds: must be > 0"),
    ({"client_processes": 0}, "--client-processes: must be >= 1"),
])  # fmt: skip
def test_bad_options_are_refused_naming_the_option(explicit, message):
    with pytest.raises(OptionError, match=message):
        validate(resolve({}, explicit))


def test_cli_refuses_bad_input_with_exit_2(tmp_path, capsys):
    assert harness.main(["nope", "--run-dir", str(tmp_path)]) == 2
    assert "unknown step 'nope'" in capsys.readouterr().err
    assert harness.main(["setup", "--run-dir", str(tmp_path), "--switch-depths", "1,9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --switch-depths") and err.count("\n") == 1
    assert not (tmp_path / "state.json").exists()  # nothing recorded for a refused command


@pytest.mark.parametrize(("argv", "message"), [
    (["setup", "--level-seconds", "abc"], "error: argument --level-seconds: invalid float "
                                           "value: 'abc'"),
    (["setup", "--parity-order", "random"], "error: --parity-order: expected alternate"),
    (["setup", "--bench-duration", "5"], "error: unrecognized arguments: --bench-duration 5"),
    (["setup"], "error: the following arguments are required: --run-dir"),
    (["sideways", "--run-dir", "RUN"], "error: unknown step 'sideways'; steps: setup, "
                                       "acceptance, check, bench, parity, compare, shapes, "
                                       "treeswitch, trace, daemon, summary, stop, all"),
])  # fmt: skip
def test_the_entry_refuses_a_bad_option_in_one_line_with_exit_2(tmp_path, argv, message):
    """`python -m benchmarks.gpu` itself: a value of the wrong type, a bad choice, a removed
    option, a missing --run-dir and an unknown step are one line on stderr each, exit 2."""
    argv = [a.replace("RUN", str(tmp_path / "run")) for a in argv]
    if "--run-dir" not in argv and argv != ["setup"]:
        argv += ["--run-dir", str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu", *argv], capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(message) and done.stderr.count("\n") == 1, done.stderr
    assert not (tmp_path / "run").exists()


def test_seeded_models_without_torch_fail_setup_naming_the_fix(tmp_path, capsys):
    """The seeded pair is built with torch: in a Python without it, `setup` fails before any
    server starts, and says what to use instead."""
    import importlib.util

    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed here: the build would run (minutes on a CPU)")
    run_dir = tmp_path / "run"
    assert harness.main(["setup", "--models", "seeded", "--backend", "sim", "--run-dir",
                         str(run_dir)]) == 1
    state = json.loads((run_dir / "state.json").read_text())
    assert state["steps"]["setup"]["error"] == (
        "--models seeded: torch (which builds the pair) is not installed in this Python; use "
        "--models dummy, or give the folders as --target/--draft")
    assert state["servers"] == {}
