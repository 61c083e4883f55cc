"""`python -m benchmarks.gpu.seeded.acceptance` against a served simulator (real HTTP over
loopback, the real plugin contract: pushes, /server_info, /metrics counters)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from benchmarks.gpu.seeded import acceptance
from benchmarks.gpu.seeded.acceptance import implied_positions
from controller.bench.server_client import ServerClient
from sglang_hooks.contract import PolicyTable, Tier


def _dataset(path, words: str, output_tokens: int = 24):
    path.write_text("".join(json.dumps({"prompt": f"{words} {i}", "output_tokens": output_tokens})
                            + "\n" for i in range(16)))  # fmt: skip
    return path


def test_implied_positions_from_accept_lengths():
    # drafts accepted with p1 = 0.8, p2 = 0.75, p3 = 0.5: L1 = 1.8, L2 = 2.4, L3 = 2.7
    got = implied_positions({1: 1.8, 2: 2.4, 3: 2.7})
    assert got == pytest.approx({1: 0.8, 2: 0.75, 3: 0.5})
    assert implied_positions({2: 2.0, 3: 2.5}) == {}  # needs depth 1 to start from
    # sampling noise: L2 - L1 larger than L1 - 1, and L3 below L2
    assert implied_positions({1: 1.3, 2: 1.8, 3: 1.7}) == pytest.approx({1: 0.3, 2: 1.0, 3: 0.0})


@pytest.mark.parametrize("sim_server", [{"admin_key": "k", "speedup": 1.0, "record": True}],
                         indirect=True)
def test_per_family_depths_and_the_off_spell(sim_server, tmp_path, capsys):
    live = PolicyTable.build([Tier(1, 3), Tier(16, 1)], version=4)
    with ServerClient(sim_server.base_url, "k") as client:
        client.push(live)
    out = tmp_path / "acc.json"
    code = acceptance.main([
        "--url", sim_server.base_url, "--admin-key", "k",
        "--dataset", str(_dataset(tmp_path / "fam_a.jsonl", "the model")),
        "--dataset", str(_dataset(tmp_path / "fam_b.jsonl", "a server")),
        "--depths", "1,2,3", "--concurrency", "4", "--requests", "8", "--off-spell", "12",
        "--off-spell-from", "8", "--out", str(out),
    ])  # fmt: skip
    assert code == 0
    result = json.loads(out.read_text())
    assert set(result["families"]) == {"fam_a", "fam_b"}
    for fam in result["families"].values():
        lengths = [row["accept_length"] for row in fam["depths"]]
        for depth, length in zip((1, 2, 3), lengths, strict=True):
            assert 1.0 <= length <= depth + 1
        # Deeper drafting accepts more per verify. Only d1 against d2 and d3 is checked: with 8
        # requests the d2-d3 gap (one more position at the profile's third rate) is within noise.
        assert lengths[0] < min(lengths[1:])
        assert all(row["other_depth_iterations"] == 0 for row in fam["depths"])
        # Positions 1 and 2 are resolved by the sample (L1 > 1 and L2 > L1 above); the third
        # rests on the d2-d3 gap, so it is only a probability.
        per_position = fam["per_position"]
        assert per_position["1"] > 0.0 and per_position["2"] > 0.0
        assert all(0.0 <= p <= 1.0 for p in per_position.values())
    spell = result["off_spell"]
    assert spell["off_then_on"]["request_steps"] > 0 and spell["on_throughout"]["request_steps"] > 0
    # each arm starts from an empty prefix cache: the second must not find the first's prompts
    assert spell["on_throughout"]["prefix_cache_flushed"] is True
    assert spell["off_then_on"]["prefix_cache_flushed"] is True
    assert spell["on_throughout"]["draft_kv_scrubbed"] is True
    assert spell["off_then_on"]["draft_kv_scrubbed"] is True
    assert sim_server.server.cache_flushes == 4
    # Each arm: a flush, other prompts at depth 3 asking twice the arm's tokens (they fill the
    # slots the arm is given next), a flush, then the arm's own prompts, each sent once: from
    # the dataset's ninth prompt on (--off-spell-from 8).
    arm_tokens = 12 + 32  # --off-spell 12, then at least 32 (the dataset asks 24)
    steps = _steps(sim_server.posts[_last_family_request(sim_server.posts) + 1:],
                   arm_heads={"8", "9", "10", "11"}, scrub_heads={"12", "13", "14", "15"})
    assert [step for step, _ in steps] == [
        "depth 3", "flush", "scrub", "depth 0", "flush", "arm",
        "depth 3",  # the off arm back to depth 3 after its first 12 tokens
        "depth 3", "flush", "scrub", "depth 3", "flush", "arm",
        "depth 3",  # the table live before, pushed back
    ]
    # Both windows cover the same stretch: the on arm's opens once its requests have decoded
    # what the off arm decoded at depth 0 (at least the 12 tokens a request the push waited
    # for), read off the server's counters; one read later at most, a few tokens a request,
    # more where a busy machine delays the read (8.5 seen on two cores under the full suite):
    # held to half of what the arm had left, which a window opened at the arm's start or end
    # still fails.
    off_from = spell["off_then_on"]["window_from_token"]
    on_from = spell["on_throughout"]["window_from_token"]
    assert 12 <= off_from < arm_tokens
    assert off_from <= on_from < off_from + (arm_tokens - off_from) / 2
    for step, tokens in steps:
        if step in ("scrub", "arm"):
            assert tokens == [2 * arm_tokens if step == "scrub" else arm_tokens] * 4
    with ServerClient(sim_server.base_url, "k") as client:  # the table live before is back
        assert client.state().table.tiers == live.tiers


def _last_family_request(posts: list[tuple[str, Any]]) -> int:
    """Index of the last completion sent before the off spell's first flush."""
    first_flush = next(i for i, (path, _) in enumerate(posts) if path == "/flush_cache")
    return max(i for i, (path, _) in enumerate(posts[:first_flush])
               if path == "/v1/completions")  # fmt: skip


def _steps(posts: list[tuple[str, Any]], arm_heads: set[str],
           scrub_heads: set[str]) -> list[tuple[str, list[int]]]:
    """The POSTs as steps: a pushed depth, a flush, or a run of completions of the arm's or
    the scrub's prompts (told by the number ending each prompt), with the tokens they asked."""
    steps: list[tuple[str, list[int]]] = []
    for path, body in posts:
        if path == "/flush_cache":
            steps.append(("flush", []))
        elif path == "/set_internal_state":
            steps.append((f"depth {body['server_args']['specctl_t0_depth']}", []))
        elif path == "/v1/completions":
            head = body["prompt"].rsplit(" ", 1)[1]
            kind = "arm" if head in arm_heads else "scrub" if head in scrub_heads else head
            if not steps or steps[-1][0] != kind:
                steps.append((kind, []))
            steps[-1][1].append(body["max_tokens"])
    return steps


@pytest.mark.parametrize("sim_server", [{"admin_key": "k"}], indirect=True)
def test_errors_name_the_option(sim_server, tmp_path, capsys):
    data = str(_dataset(tmp_path / "d.jsonl", "x"))
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "k", "--dataset", data,
                            "--depths", "1,9"]) == 2  # fmt: skip
    assert "depths [9] were not captured" in capsys.readouterr().err
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "k", "--dataset",
                            str(tmp_path / "missing.jsonl")]) == 2  # fmt: skip
    assert "dataset not found" in capsys.readouterr().err
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "wrong",
                            "--dataset", data, "--depths", "1"]) == 2  # fmt: skip
    assert "401" in capsys.readouterr().err
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "k", "--dataset", data,
                            "--depths", "1", "--requests", "2", "--concurrency", "9",
                            "--off-spell", "4"]) == 2  # fmt: skip
    assert "needs 18 prompts in the first dataset" in capsys.readouterr().err
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "k", "--dataset", data,
                            "--depths", "1", "--requests", "2", "--concurrency", "4",
                            "--off-spell", "4", "--off-spell-from", "10"]) == 2  # fmt: skip
    assert "needs 8 prompts in the first dataset from prompt 10" in capsys.readouterr().err
    assert acceptance.main(["--url", sim_server.base_url, "--admin-key", "k", "--dataset", data,
                            "--off-spell", "4", "--off-spell-from", "-1"]) == 2  # fmt: skip
    assert "--off-spell-from must be >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        acceptance.main(["--url", sim_server.base_url, "--dataset", data, "--depths", "0,1"])
