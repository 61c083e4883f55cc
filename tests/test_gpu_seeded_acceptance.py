"""`python -m benchmarks.gpu.seeded.acceptance` against a served simulator (real HTTP over
loopback, the real plugin contract: pushes, /server_info, /metrics counters)."""

from __future__ import annotations

import json

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


@pytest.mark.parametrize("sim_server", [{"admin_key": "k", "speedup": 1.0}], indirect=True)
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
        "--out", str(out),
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
    assert sim_server.server.cache_flushes == 2
    assert spell["loss"] == pytest.approx(
        spell["on_throughout"]["accept_length"] - spell["off_then_on"]["accept_length"], abs=1e-3)
    assert "implied per-position acceptance" in capsys.readouterr().out
    with ServerClient(sim_server.base_url, "k") as client:  # the table live before is back
        assert client.state().table.tiers == live.tiers


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
    with pytest.raises(SystemExit):
        acceptance.main(["--url", sim_server.base_url, "--dataset", data, "--depths", "0,1"])
