"""A simulated shape server (`specctl sim serve --shapes`) over real loopback HTTP: what it
reports, the tables it takes and refuses as the plugin's shape server does, the shape it runs
under load and its per-shape series in real Prometheus text. The profile is the one fitted to
run 30's real bench of shapes (benchmarks/shape_sim_check.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from controller.bench.server_client import ServerClient
from controller.cli import load_commands
from sglang_hooks.contract import (
    METRIC_ITERATIONS,
    METRIC_REQUEST_STEPS,
    METRIC_TOKENS,
    TREE_COUNTER_FAMILIES,
    PolicyTable,
    Tier,
    encode_table,
    shape_tier,
)
from sglang_hooks.draft_shape import DraftShape, parse_shape

PROFILE = str(Path(__file__).resolve().parents[1] / "benchmarks" / "results"
              / "shape_sim_run30.yaml")  # fmt: skip
TREE = DraftShape(3, 4, 16)
TREE_ITERATIONS = TREE_COUNTER_FAMILIES[0]
TREE_THEN_CHAIN = PolicyTable.build([shape_tier(1, TREE), shape_tier(8, parse_shape("3x1x4"))])


def _series(text: str, family: str) -> dict[tuple[str, str], float]:
    """{(label, bs_bucket): value} of a counter family, by its shape or depth label."""
    out = {}
    for fam in text_string_to_metric_families(text):
        for sample in fam.samples:
            if sample.name == f"{family}_total":
                key = sample.labels.get("shape") or sample.labels["depth"]
                out[(key, sample.labels["bs_bucket"])] = sample.value
    return out


def test_a_shape_server_reports_its_start_up_shape_and_captures(sim_server_factory) -> None:  # type: ignore[no-untyped-def]
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"])
    info = httpx.get(f"{handle.base_url}/server_info", timeout=5).json()
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"],
            info["speculative_num_draft_tokens"], info["speculative_adaptive"]) == (3, 4, 16, False)
    with ServerClient(handle.base_url) as client:
        state = client.state()
    assert state.captured_depths == (3,) and state.captured_trees == (TREE,)
    assert state.table is None and state.source == "none"
    assert state.shapes is not None and state.shapes["startup"] == "3x4x16"
    assert set(state.shapes["captured"]) == {"3x1x4", "3x4x16"}
    assert state.off_path == {"path": "sglang", "features": []}


def test_a_tree_table_switches_the_shape_with_the_load(sim_server_factory) -> None:  # type: ignore[no-untyped-def]
    """At one stream the tree runs (its series by shape), at 32 the chain (its depth's series);
    the switches are counted and `/server_info` names the live shape."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"], speedup=100.0)
    with ServerClient(handle.base_url) as client:
        assert client.push(TREE_THEN_CHAIN).table == TREE_THEN_CHAIN
        handle.server.set_concurrency(1)
        time.sleep(0.5)
        low = client.metrics_text()
        assert client.state().shapes["live"] == "3x4x16"  # type: ignore[index]
        handle.server.set_concurrency(32)
        time.sleep(0.8)
        high = client.metrics_text()
        state = client.state()
    trees = _series(low, TREE_ITERATIONS)
    assert trees and all(shape == "3x4x16" for shape, _ in trees)
    assert not _series(low, METRIC_ITERATIONS)
    chains = _series(high, METRIC_ITERATIONS)
    assert chains and {depth for depth, _ in chains} == {"3"}
    assert state.shapes is not None and state.shapes["live"] == "3x1x4"
    assert state.shapes["switches"] >= 1
    info = httpx.get(f"{handle.base_url}/server_info", timeout=5).json()
    assert info["internal_states"][0]["specctl"]["tree_results"] == sum(
        v for (_, b), v in _series(high, TREE_ITERATIONS).items())


def test_a_shape_server_with_plain_captures_off_and_runs_it_under_an_off_tier(
    sim_server_factory,  # type: ignore[no-untyped-def]
) -> None:
    """`--shapes 3x4x16,3x1x4,plain`: depth 0 among the captured depths and plain among the
    captured shapes, off on the plugin's path with the extend skipped; a pushed table with an
    off tier is taken, and under load off runs (depth 0's series, nothing accepted)."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x4x16", "3x1x4", "plain"],
                                admin_key="k", speedup=100.0)  # fmt: skip
    info = httpx.get(f"{handle.base_url}/server_info", timeout=5).json()
    assert (info["speculative_num_steps"], info["speculative_eagle_topk"]) == (3, 4)
    off = PolicyTable.build([shape_tier(1, TREE), shape_tier(21, None)])
    with ServerClient(handle.base_url, "k") as client:
        state = client.state()
        assert state.captured_depths == (0, 3) and state.captured_trees == (TREE,)
        assert state.shapes is not None and state.shapes["live"] == "3x4x16"
        assert set(state.shapes["captured"]) == {"3x4x16", "3x1x4", "plain"}
        assert state.off_path == {"path": "specctl", "features": ["skip-extend"]}
        assert client.push(off).table == off
        handle.server.set_concurrency(48)
        time.sleep(0.8)
        text = client.metrics_text()
        state = client.state()
    depths = _series(text, METRIC_ITERATIONS)
    assert {depth for depth, _ in depths} == {"0"}  # the tree runs no per-depth series
    tokens = _series(text, METRIC_TOKENS)
    steps = _series(text, METRIC_REQUEST_STEPS)
    assert sum(tokens.values()) == sum(steps.values()) > 0  # the bonus token only
    assert state.shapes is not None and state.shapes["live"] == "plain"
    rank = httpx.get(f"{handle.base_url}/server_info", timeout=5).json()
    info_rank = rank["internal_states"][0]["specctl"]
    assert info_rank["captured_depths"] == [0, 3]
    assert info_rank["skipped_draft_extends"] >= sum(depths.values())  # read later
    assert info_rank["shapes"]["captured"]["plain"]["target_topk"] == 1


def test_sim_serve_with_plain_on_a_profile_without_it_says_how_to_fit_one(tmp_path: Path) -> None:
    profile = yaml.safe_load(Path(PROFILE).read_text())
    del profile["shapes"]["plain"]
    path = tmp_path / "drafting.yaml"
    path.write_text(yaml.safe_dump(profile))
    res = CliRunner().invoke(load_commands(), ["sim", "serve", "--profile", str(path),
                                               "--shapes", "3x4x16,3x1x4,plain"])  # fmt: skip
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1, res.output
    assert lines[0].startswith(f"error: --shapes: profile {profile['name']} has no plain shape")
    assert "fit the profile from a bench of shapes that includes plain" in lines[0]


@pytest.mark.parametrize(("table", "field", "reason"), [
    (PolicyTable.build([shape_tier(1, DraftShape(5, 8, 32))]), "tiers[0]",
     "tree 5x8x32 was not captured by the server (captured trees: 3x4x16)"),
    (PolicyTable.build([shape_tier(1, TREE), Tier(64, 0)]), "specctl_t1_depth",
     "depth 0 was not captured by the server (captured: [3])"),
])  # fmt: skip
def test_a_table_the_shape_server_cannot_run_is_refused(
    sim_server_factory: Callable[..., object], table: PolicyTable, field: str, reason: str
) -> None:
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"])
    body = {"server_args": encode_table(table)}
    res = httpx.post(f"{handle.base_url}/set_internal_state", json=body, timeout=5)  # type: ignore[attr-defined]
    assert res.status_code == 400
    text = res.text
    assert field in text and reason in text, text


@pytest.mark.parametrize(("args", "expected"), [
    (["--shapes", "plain"],
     "error: --shapes: a shape server drafts: list a drafting shape beside plain"),
    (["--shapes", "3x1x4,4x2x8"], "error: --shapes: shape 4x2x8 is not in the profile"),
    (["--shapes", "3x4x16,7x2x8"],
     "error: --shapes: shapes 3x4x16,7x2x8: no listed shape has the largest top-k (4)"),
    (["--shapes", "3x4x16", "--no-speculative"], "error: --shapes: a shape server drafts"),
])  # fmt: skip
def test_sim_serve_refuses_a_shape_list_it_cannot_start_with_one_line(
    args: list[str], expected: str, tmp_path: Path
) -> None:
    """7x2x8 (added to a copy of the profile) drafts 14 positions a round to 3x4x16's 12 but
    verifies 8 to its 16: neither dominates."""
    profile = yaml.safe_load(Path(PROFILE).read_text())
    profile["shapes"]["7x2x8"] = dict(profile["shapes"]["3x4x16"])
    path = tmp_path / "more.yaml"
    path.write_text(yaml.safe_dump(profile))
    res = CliRunner().invoke(load_commands(), ["sim", "serve", "--profile", str(path), *args])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith(expected), res.output


def test_status_reads_a_tree_s_decode_work_by_shape(sim_server_factory) -> None:  # type: ignore[no-untyped-def]
    """A tree runs with no per-depth series: status counts it by shape, not as idle."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"], concurrency=4.0,
                                speedup=20.0)  # fmt: skip
    time.sleep(0.5)
    res = CliRunner().invoke(load_commands(), ["status", "--url", handle.base_url, "--json",
                                               "--window", "1"])  # fmt: skip
    assert res.exit_code == 0, res.output
    (server,) = json.loads(res.output)["servers"]
    assert [(d["shape"], d["depth"]) for d in server["depths"]] == [("3x4x16", 3)]
    assert server["depths"][0]["accept_length"] > 3.0 and server["decoding"] is True
    assert server["metrics_note"] is None


def test_the_daemon_steers_a_shape_server_and_leaves_it_as_found(
    sim_server_factory: Callable[..., object], tmp_path: Path
) -> None:
    """No table on the server: the daemon takes over from the start-up shape with its shape
    learner (probing the chain it has not measured) and, at exit, leaves the server as found."""
    handle = sim_server_factory(profile=PROFILE, shapes=["3x1x4", "3x4x16"], admin_key="k",
                                concurrency=4.0, speedup=20.0)  # fmt: skip
    config = tmp_path / "daemon.yaml"
    config.write_text(yaml.safe_dump({
        "targets": [{"name": "shapes", "url": handle.base_url, "admin_key": "k"}],  # type: ignore[attr-defined]
        "schedule": {"clock": "wall", "duration_s": 4, "scrape_interval_s": 0.5,
                     "fit_interval_s": 1, "decide_interval_s": 1},
        "metrics": {"enabled": False}, "store": {"path": str(tmp_path / "d.sqlite")}}))
    res = CliRunner().invoke(load_commands(), ["daemon", "-c", str(config)])
    text = " ".join(res.output.split())
    assert res.exit_code == 0, res.output
    assert ("shapes: the server switches draft shapes (3x1x4, 3x4x16); the daemon learns each "
            "shape's tok/s per batch bucket") in text
    assert "found its start-up shape running" in text and "no specctl_* counters" not in text
    assert "push shapes [learned] v1" in text and "3x4x16 (probes)" in text, text
    assert "left released (SGLang's own choice), as found at start-up" in text
    with ServerClient(handle.base_url, "k") as client:  # type: ignore[attr-defined]
        assert client.state().table is None
