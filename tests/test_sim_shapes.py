"""Static draft shapes in the simulator: the cost model at a shape, a server started at one, the
fit on a real bench of shapes (run 30: SGLang 0.5.17 on an H200, trees and a chain on two prompt
families) and `specctl sim shapes`, its output and its error lines.

The fit runs once per module on run 30's checked-in folder (about 10 s on one core)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from controller.bench.level_flags import level_flags
from controller.cli import load_commands
from sglang_hooks.contract import parse_table
from sglang_hooks.draft_shape import parse_shape
from sims.fit.bench_file import BenchFileError
from sims.fit.profile_file import write_profile
from sims.fit.shape_check import ShapeRow, best_shapes, replay_rows, tok_errors
from sims.fit.shape_fit import ShapeFit, fit_shapes
from sims.fit.shape_folder import ShapeBench, load_shapes
from sims.profile import Profile, ProfileError, load_profile
from sims.shape_server import ShapeQuestionError, shape_server

app = load_commands()
RUN30 = (Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "gpu"
         / "h200-sglang-0.5.17-seeded-8b-run30" / "shapes")  # fmt: skip
BASE = "h200-sglang-llama8b-seeded"


@pytest.fixture(scope="module")
def bench() -> ShapeBench:
    return load_shapes(RUN30, level_flags)


@pytest.fixture(scope="module")
def fitted(bench: ShapeBench) -> ShapeFit:
    return fit_shapes(bench, load_profile(BASE), "run30-shapes")


@pytest.fixture(scope="module")
def rows(fitted: ShapeFit, bench: ShapeBench) -> list[ShapeRow]:
    return replay_rows(fitted.profile, bench)


@pytest.fixture(scope="module")
def profile_file(fitted: ShapeFit, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shapes") / "shapes.yaml"
    write_profile(fitted.profile, path)
    return path


def _with_shapes(shapes: dict[str, dict[str, object]], base: str = BASE) -> Profile:
    return Profile.model_validate({**load_profile(base).model_dump(), "shapes": shapes})


def test_a_chain_shape_without_terms_costs_what_its_depth_does() -> None:
    """3x1x4 is depth 3: the cost model at the shape is the depth's, term for term."""
    profile = _with_shapes({"3x1x4": {"accept_length": {"a": 3.0}}})
    batch = np.arange(1, 129)
    assert np.allclose(profile.shape_iteration_ms("3x1x4", batch), profile.iteration_ms(3, batch))


def test_a_tree_verifies_batch_times_draft_tokens() -> None:
    """3x4x16 verifies 16 positions a request, the chain of the same steps 4: the tree's extra
    cost over the chain grows with the batch, and its terms add on top."""
    profile = _with_shapes({"3x1x4": {"accept_length": {"a": 3.0}},
                            "3x4x16": {"accept_length": {"a": 3.9}}})  # fmt: skip
    batch = np.array([1, 16, 64, 256])
    extra = profile.shape_iteration_ms("3x4x16", batch) - profile.shape_iteration_ms("3x1x4", batch)
    assert np.all(np.diff(extra) > 0)
    more = _with_shapes({"3x1x4": {"accept_length": {"a": 3.0}},
                         "3x4x16": {"accept_length": {"a": 3.9}, "fixed_ms": 1.0,
                                    "us_per_position": 10.0}})  # fmt: skip
    added = more.shape_iteration_ms("3x4x16", batch) - profile.shape_iteration_ms("3x4x16", batch)
    assert np.allclose(added, 1.0 + 10.0 * batch * 16 / 1000)


def test_a_server_started_at_a_shape_accepts_what_the_shape_does() -> None:
    """The engine runs the shape's steps as its one depth; the chain it samples from has the
    shape's mean accept length, per phase."""
    profile = _with_shapes({"3x4x16": {"accept_length": {"a": 3.9, "b": 3.5}}, "plain": {}})
    server = shape_server(profile, "3x4x16")
    assert server.depth == 3 and server.profile.captured_depths == [3]
    for phase, length in (("a", 3.9), ("b", 3.5)):
        assert server.profile.acceptance.expected_length(phase, 3) == pytest.approx(length, 1e-3)
    plain = shape_server(profile, "plain")
    assert plain.depth is None and not plain.speculative
    with pytest.raises(ShapeQuestionError, match="shape 5x8x32 is not in profile"):
        shape_server(profile, "5x8x32")


def test_a_depth_only_profile_refuses_a_shape_question() -> None:
    with pytest.raises(ShapeQuestionError, match=r"describes no draft shapes .* sim fit --shapes"):
        shape_server(load_profile(BASE), "3x1x4")


@pytest.mark.parametrize(("shapes", "message"), [
    ({"3x4": {}}, "shapes: shape '3x4': write STEPSxTOPKxDRAFT"),
    ({"3x4x16": {"accept_length": {"a": 4.5}}}, r"exceeds steps \+ 1 \(4\)"),
    ({"3x4x16": {"accept_length": {"a": 3.0}}, "3x1x4": {"accept_length": {"b": 2.0}}},
     "every shape needs the same phases"),
    ({"plain": {"accept_length": {"a": 1.0}}}, "a plain server accepts nothing"),
    ({"3x1x4": {"accept_length": {"a": 3.0}, "fixed_ms": -9.0}}, "costs 0 ms or less"),
    ({"plain": {"fixed_ms": -99.0}}, r"shapes\.plain: its iteration costs 0 ms or less"),
])  # fmt: skip
def test_a_profile_s_shapes_are_checked(tmp_path: Path, shapes: dict[str, object],
                                        message: str) -> None:  # fmt: skip
    data = {**load_profile(BASE).model_dump(mode="json"), "shapes": shapes}
    path = tmp_path / "p.yaml"
    path.write_text(json.dumps(data))
    with pytest.raises(ProfileError, match=message):
        load_profile(path)


def test_the_fit_leaves_out_what_the_bench_flagged(bench: ShapeBench, fitted: ShapeFit) -> None:
    flagged = {sl.label for sl in bench.levels if sl.flags}
    assert {lo.level.label for lo in fitted.left_out} == flagged
    assert "3x4x16 a c=64" in flagged and "plain a c=1" in flagged  # too short, too few
    assert all("flagged by the bench" in lo.reason for lo in fitted.left_out)
    assert not {sl.label for sl in fitted.fitted} & flagged


def test_fitted_accept_lengths_are_sglang_s(bench: ShapeBench, fitted: ShapeFit) -> None:
    """Each shape's accept length per family lies among the unflagged levels' own (SGLang's
    counters) and within 3% of each: SGLang's own figure moves up to 2.7% between the loads of
    one shape and family on run 30."""
    assert fitted.profile.shapes is not None
    for sl in fitted.fitted:
        if sl.shape == "plain":
            continue
        same = [a for o in fitted.fitted if (o.shape, o.family) == (sl.shape, sl.family)
                and (a := o.level.accept_length) is not None]  # fmt: skip
        got = fitted.profile.shapes[sl.shape].accept_length[sl.family]
        assert min(same) <= got <= max(same)
        assert got == pytest.approx(sl.level.accept_length, rel=0.03), sl.label
    assert fitted.profile.shapes["3x4x16"].accept_length["b"] == pytest.approx(3.56, rel=0.02)
    assert fitted.profile.shapes["3x1x4"].accept_length["b"] == pytest.approx(1.90, rel=0.02)


def test_the_fit_takes_the_servers_limits(fitted: ShapeFit) -> None:
    sched = fitted.profile.scheduler
    assert sched.max_running_requests_spec == sched.max_running_requests_nospec == 256
    assert sched.max_total_tokens == 196608


def test_simulated_tok_s_of_unflagged_levels(rows: list[ShapeRow]) -> None:
    """The tree's level at 16 streams on family b (where a tree beats the chain by 11%) within
    8%: the fit leaves each level's iteration within about 4% of the server's (the line
    through its levels, asserted by the TPOT below), and tok/s adds the base's prefill and
    client time, which a bench of shapes does not refit (run 30: 4-6% at 16 streams). The
    median over every unflagged level within 5%."""
    by_label = {r.level.label: r for r in rows}
    tree = by_label["3x4x16 b c=16"]
    assert tree.tok_error is not None and abs(tree.tok_error) <= 0.08, tree.tok_error
    assert abs(tree.tpot_error or 1.0) <= 0.05
    assert tok_errors(rows).median <= 0.05


def test_the_simulator_picks_family_b_s_shapes(rows: list[ShapeRow]) -> None:
    """Family b, where the head keeps about half its guesses: the tree at 1-16 streams, the
    chain at 64, the plain server at 128, as measured."""
    best = {b.streams: (b.measured, b.simulated) for b in best_shapes(rows) if b.family == "b"}
    assert best == {1: ("3x4x16", "3x4x16"), 4: ("3x4x16", "3x4x16"),
                    16: ("3x4x16", "3x4x16"), 64: ("3x1x4", "3x1x4"), 128: ("plain", "plain")}


def test_a_folder_named_for_another_shape_is_refused(tmp_path: Path) -> None:
    copy = tmp_path / "shapes"
    shutil.copytree(RUN30 / "3x4x16", copy / "3x4x8")
    with pytest.raises(BenchFileError, match="the server ran 3x4x16, but its folder names 3x4x8"):
        load_shapes(copy, level_flags)


RUN34 = RUN30.parents[1] / "h100-sglang-0.5.17-seeded-8b-run34" / "treeswitch"


def test_the_held_shapes_of_a_shape_server_are_read_as_a_bench_of_shapes(tmp_path: Path) -> None:
    """Run 34's one server started at 3x4x16 and held at each captured shape: its answer says
    it started at the tree, and its plugin's report that it captured the chain too, so each held
    bench is read as that shape's; a shape it did not capture is still refused."""
    held = tmp_path / "held"
    for shape in ("3x4x16", "3x1x4"):
        (held / shape).mkdir(parents=True)
        shutil.copy(RUN34 / f"held-{shape}" / "a.json", held / shape / "a.json")
        shutil.copy(RUN34 / "server_info.json", held / shape / "server_info.json")
    bench = load_shapes(held, level_flags)
    assert bench.shapes == ["3x1x4", "3x4x16"] and bench.families == ["a"]
    assert {lv.level.concurrency for lv in bench.levels if lv.shape == "3x1x4"} == {1, 16, 64}
    shutil.copytree(held / "3x1x4", held / "2x1x3")
    with pytest.raises(BenchFileError, match="the server ran 3x4x16, but its folder names 2x1x3"):
        load_shapes(held, level_flags)


def _cli(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["sim", "shapes", *args])
    assert result.exception is None or isinstance(result.exception, SystemExit)
    return result.exit_code, result.output


def test_the_shapes_command_prints_tok_s_and_the_best_shape(profile_file: Path,
                                                           tmp_path: Path) -> None:  # fmt: skip
    plot = tmp_path / "shapes.png"
    code, out = _cli("--profile", str(profile_file), "--phase", "b", "--streams", "1,64",
                     "--duration", "20", "--warmup", "4", "--output-tokens", "128:384",
                     "--plot", str(plot))  # fmt: skip
    assert code == 0, out
    for name in ("3x1x4", "3x4x16", "5x8x32", "plain"):
        assert name in out
    assert re.search(r"L=3\.[56]\d", out)  # the tree's accept length on family b
    assert "best shape per load: 1: 3x4x16 | 64: 3x1x4" in " ".join(out.split())
    assert re.search(r"as a table: 1-\d+: 3x4x16 \| \d+\+: d3", " ".join(out.split()))
    assert plot.stat().st_size > 10_000
    code, out = _cli("--profile", str(profile_file), "--phase", "b", "--streams", "1,64",
                     "--duration", "20", "--warmup", "4", "--output-tokens", "128:384",
                     "--shapes", "3x4x16,3x1x4", "--json")  # fmt: skip
    doc = json.loads(out)
    assert [(b["streams"], b["shape"]) for b in doc["best"]["b"]] == [(1, "3x4x16"), (64, "3x1x4")]
    tree, chain = parse_table(doc["tables"]["b"]).tiers
    assert tree.shape == parse_shape("3x4x16") and chain.shape == parse_shape("3x1x4")
    assert 1 < chain.min_batch <= 64
    assert {p["shape"] for p in doc["points"]} == {"3x4x16", "3x1x4"}


def test_the_shapes_command_writes_a_phase_s_table_as_a_policy_file(
    profile_file: Path, tmp_path: Path
) -> None:
    """The file holds the phase's tree table with where it came from; `freeze --check` reads it,
    and a server that captured the tree would accept it (one that did not is told so)."""
    from controller.daemon.policy_file import PolicyFileError, load

    out = tmp_path / "shapes-b.yaml"
    res = CliRunner().invoke(app, ["sim", "shapes", "--profile", str(profile_file), "--phase", "b",
                                   "--streams", "1,64", "--duration", "20", "--warmup", "4",
                                   "--output-tokens", "128:384", "--json",
                                   "--policy-out", str(out)])  # fmt: skip
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    policy = load(out, captured_depths=[0, 3], captured_trees=[parse_shape("3x4x16")])
    assert policy.table == parse_table(doc["tables"]["b"])
    assert policy.table.tiers[0].shape == parse_shape("3x4x16")
    prov = policy.provenance.model_dump()
    assert prov["created_by"] == "specctl sim shapes" and prov["phase"] == "b"
    assert prov["streams"] == [1, 64] and prov["fingerprint"] == policy.table.fingerprint
    with pytest.raises(PolicyFileError, match="captured trees: none"):
        load(out, captured_depths=[0, 3])
    check = CliRunner().invoke(app, ["freeze", "--check", str(out)])
    assert check.exit_code == 0 and "3x4x16" in check.output


def test_a_policy_file_needs_one_phase(profile_file: Path, tmp_path: Path) -> None:
    code, out = _cli("--profile", str(profile_file), "--policy-out", str(tmp_path / "p.yaml"))
    assert code == 2 and out.strip().startswith("error: --phase: name the phase whose table")
    code, out = _cli("--profile", str(profile_file), "--phase", "b",
                     "--policy-out", str(tmp_path / "nowhere" / "p.yaml"))  # fmt: skip
    assert code == 2 and "folder" in out and "does not exist" in out


@pytest.mark.parametrize(("args", "expected"), [
    (["--shapes", "3x4"], "error: --shapes: shape '3x4': write STEPSxTOPKxDRAFT like 3x4x16"),
    (["--shapes", "3x1x5"], "error: --shapes: shape '3x1x5': a chain (topk 1) verifies"),
    (["--shapes", "4x2x8"], "error: --shapes: shape 4x2x8 is not in the profile (it has 3x1x4, "
                            "3x4x16, 5x8x32, plain)"),
    (["--phase", "chat"], "error: --phase: unknown phase 'chat'"),
    (["--plot", "x.gif"], "error: --plot x.gif: unsupported format"),
])  # fmt: skip
def test_the_shapes_command_s_errors_are_one_line(profile_file: Path, args: list[str],
                                                  expected: str) -> None:  # fmt: skip
    code, out = _cli("--profile", str(profile_file), *args)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith(expected), out


def test_the_shapes_command_on_a_depth_only_profile() -> None:
    code, out = _cli("--profile", BASE)
    lines = [ln for ln in out.splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1
    assert lines[0].startswith(f"error: --profile: profile {BASE} describes no draft shapes")


def test_sim_fit_shapes_writes_a_profile_the_command_reads(tmp_path: Path) -> None:
    out = tmp_path / "fitted.yaml"
    result = CliRunner().invoke(app, ["sim", "fit", "--shapes", str(RUN30), "--base", BASE,
                                      "--out", str(out), "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["tok_error"]["levels"] == 34 and len(doc["rows"]) == 48
    assert sum(r["left_out"] is not None for r in doc["rows"]) == 14
    profile = load_profile(out)
    assert profile.shapes is not None and sorted(profile.shapes) == [
        "3x1x4", "3x4x16", "5x8x32", "plain"]
    assert "Draft shapes fitted by specctl sim fit --shapes" in profile.sources[-3]
    both = CliRunner().invoke(app, ["sim", "fit", str(out), "--shapes", str(RUN30),
                                    "--out", str(tmp_path / "x.yaml")])  # fmt: skip
    assert both.exit_code == 2 and "not both" in both.output
