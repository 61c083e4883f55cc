"""`python -m benchmarks.gpu.sim_trace RUN_DIR` on a run folder of the GPU harness (one made
with the harness's CPU backend, tests/data/gpu_trace_run/README.md): the fit of its bench, the
trace replayed under every policy, the comparison; and each missing input as one error line."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from statistics import fmean

import pytest
import yaml
from scipy import stats

from benchmarks.gpu.sim_trace import cli
from benchmarks.gpu.sim_trace.inputs import trace_lengths
from sims.fit.bench_file import load_bench
from sims.policies import FixedDepthPolicy
from sims.profile import load_profile
from sims.sweep import SweepSpec, run_point
from sims.workload import load_scenario

FIXTURE = Path(__file__).parent / "data" / "gpu_trace_run"
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """A copy: the command writes its results into the run's trace folder."""
    return Path(shutil.copytree(FIXTURE, tmp_path / "run"))


def _family_a(run: Path) -> str:
    """The accept lengths the acceptance step measured on the run's one family, as --accept
    text: the stand-in server has one acceptance, so family b's are the same."""
    rows = json.loads((run / "acceptance/acceptance.json").read_text())["families"]["family_a"]
    return ",".join(f"{r['depth']}:{r['accept_length']}" for r in rows["depths"])


def _closed(run: Path, name: str) -> dict:  # type: ignore[type-arg]
    return json.loads((run / "trace" / name).read_text())


@pytest.mark.slow
def test_the_run_is_fitted_replayed_under_every_policy_and_compared(run_dir, capsys):
    accept = f"b={_family_a(run_dir)}"
    code = cli.main([str(run_dir), "--accept", accept, "--seeds", "0,1",
                     "--fit-evaluations", "6"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    real = _closed(run_dir, "closed_loop.json")
    sim = _closed(run_dir, "sim_closed_loop.json")
    assert sim["source"] == "simulator" and sim["phases"] == real["phases"]
    assert sim["seeds"] == [0, 1] and sim["repeats"] == 2
    assert sim["profile"]["file"] == "sim_profile.yaml"
    # every policy the real trace ran has a simulated counterpart but the warm daemon
    assert set(sim["policies"]) | set(sim["not_simulated"]) == set(real["policies"])
    assert list(sim["not_simulated"]) == ["daemon-warm"]
    assert all(len(v) == 2 and min(v) > 0 for v in sim["policies"].values())
    # speculation pays at the trace's few streams on the profile its bench fitted
    assert fmean(sim["policies"]["static:3"]) > fmean(sim["policies"]["plain"])

    # the profile: the bench's fit, with the trace's datasets as acceptance phases
    profile = load_profile(run_dir / "trace/sim_profile.yaml")
    assert {"a", "b"} <= set(profile.acceptance.phases)
    bench = load_bench(run_dir / "bench/bench.json")
    spec = json.loads((run_dir / "bench/bench.json").read_text())["servers"]["spec"]
    assert profile.scheduler.max_running_requests_spec == bench.spec.cap
    assert profile.captured_depths == sorted(spec["captured_depths"])
    scenario = load_scenario(run_dir / "trace/sim_scenario.yaml")
    assert set(scenario.workload.phase_names()) == {"a", "b"}

    # the report: a row per policy with both figures, and the two checks
    text = (run_dir / "trace/sim_compare.md").read_text()
    assert text.strip() in out
    for name, values in real["policies"].items():
        row = next(line for line in text.splitlines() if line.startswith(f"| {name} |"))
        assert f"{fmean(values):,.1f}" in row
        if name in sim["policies"]:
            ratio = fmean(sim["policies"][name]) / fmean(values)
            assert f"| {ratio:.3f} |" in row
    assert "- the simulated trace ranks the policies as the real one does: " in text
    assert "- tok/s within 5% per policy: " in text

    # per phase, from each real run's file: the real and simulated tok/s side by side; a
    # static policy's phases, weighted by their seconds, make its whole-trace figure
    per_phase = sim["phase_tok_per_s"]
    assert set(per_phase) == set(sim["policies"])
    seconds = [float(p.split(":")[0]) for p in real["phases"].split(",")]
    assert all(len(v) == len(seconds) for v in per_phase.values())
    whole = sum(t * s for t, s in zip(per_phase["static:3"], seconds, strict=True)) / sum(seconds)
    assert whole == pytest.approx(fmean(sim["policies"]["static:3"]), rel=0.02)
    table = text[text.index("Per phase, real / simulated tok/s"):]
    row = next(line for line in table.splitlines() if line.startswith("| static:3 |"))
    real_first = _closed(run_dir, "static-3.json")["phases"][0]["tok_per_s"]
    assert row.split(" | ")[1].startswith(f"{real_first:,.0f} / {per_phase['static:3'][0]:,.0f}")

    # Given the profile it wrote, the same seed gives the same figures (no fit this time).
    before = sim["policies"]
    assert cli.main([str(run_dir), "--accept", accept, "--seeds", "1",
                     "--profile", str(run_dir / "trace/sim_profile.yaml")]) == 0  # fmt: skip
    again = _closed(run_dir, "sim_closed_loop.json")["policies"]
    assert {k: v[0] for k, v in again.items()} == {k: v[1] for k, v in before.items()}


def test_a_one_phase_trace_at_depth_3_is_what_the_profile_predicts(run_dir, capsys):
    """A trace of one phase, `static:3` only: the simulated trace's tok/s is the profile's
    closed loop at those streams and depth on that dataset's acceptance (a sweep point), in
    the units of the real trace (per wall second of the run's 10x servers)."""
    streams, seconds = 4, 30.0
    closed = _closed(run_dir, "closed_loop.json")
    closed.update(phases=f"{seconds:g}:{streams}:a", policies={"static:3": [1.0]})
    (run_dir / "trace/closed_loop.json").write_text(json.dumps(closed))
    # an accept length unlike the bench's, so that another phase would show
    code = cli.main([str(run_dir), "--profile", "h200-llama8b-eagle3",
                     "--accept", "a=1:1.3,3:1.45"])  # fmt: skip
    assert code == 0, capsys.readouterr()
    got = _closed(run_dir, "sim_closed_loop.json")["policies"]["static:3"][0]

    clock = load_bench(run_dir / "bench/bench.json").spec.speedup
    lengths = trace_lengths(run_dir / "trace")
    assert lengths is not None
    prompt, output = lengths
    profile = load_profile(run_dir / "trace/sim_profile.yaml")
    spec = SweepSpec(concurrency=[streams], depths=[3], duration_s=seconds * clock,
                     warmup_s=2.0, prompt_tokens=int(prompt.mean),
                     output_tokens=int(output.mean), phase="a", include_adaptive=False)
    start, end = run_point(profile, spec, streams, policy=FixedDepthPolicy(3))
    assert end.accept_length == pytest.approx(1.45, rel=0.05)
    assert got == pytest.approx(end.tok_per_s_since(start) * clock, rel=0.03)


def test_a_bench_that_recommended_no_table_leaves_bench_table_out(run_dir, capsys):
    """The trace's bench-table ran another bench's table (--trace-bench): the others are
    still simulated, and the report says why that one is not and what to give."""
    bench = json.loads((run_dir / "bench/bench.json").read_text())
    bench["recommended_table"] = None
    (run_dir / "bench/bench.json").write_text(json.dumps(bench))
    closed = _closed(run_dir, "closed_loop.json")
    closed["policies"] = {k: closed["policies"][k] for k in ("bench-table", "static:3")}
    (run_dir / "trace/closed_loop.json").write_text(json.dumps(closed))
    assert cli.main([str(run_dir), "--profile", "h200-llama8b-eagle3",
                     "--accept", f"b={_family_a(run_dir)}"]) == 0  # fmt: skip
    sim = _closed(run_dir, "sim_closed_loop.json")
    assert list(sim["policies"]) == ["static:3"]
    why = sim["not_simulated"]["bench-table"]
    assert "the bench recommended no table" in why and "give --bench" in why
    assert f"bench-table: not simulated: {why}" in capsys.readouterr().out


def _error(run: Path, *args: str) -> str:
    """The one line of a failing run of the module's entry (a real process)."""
    done = subprocess.run([sys.executable, "-m", "benchmarks.gpu.sim_trace", str(run), *args],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)  # fmt: skip
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("error: ") and "Traceback" not in done.stderr
    return lines[0]


def test_a_missing_bench_is_one_error_line_naming_the_step(run_dir):
    shutil.rmtree(run_dir / "bench")
    line = _error(run_dir, "--accept", "b=1:1.5")
    assert f"no bench at {run_dir / 'bench/bench.json'}" in line
    assert "run the bench step" in line and "--bench DIR" in line
    assert not (run_dir / "trace/sim_closed_loop.json").exists()


def test_missing_inputs_name_the_step_or_the_option(run_dir, capsys):
    def error(*args: str, run: Path = run_dir) -> str:
        assert cli.main([str(run), *args]) == 2
        lines = capsys.readouterr().err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), lines
        return lines[0]

    # the acceptance step measured family a only; b needs --accept
    assert "dataset 'b' has no accept lengths" in error()
    assert "--accept b=1:L1,3:L3" in error()
    assert "the trace has no dataset 'c'" in error("--accept", "b=1:1.5", "--accept", "c=1:1.5")
    assert "1 <= length <= depth + 1" in error("--accept", "b=1:2.5")
    (run_dir / "acceptance/acceptance.json").unlink()
    line = error()
    assert "run the acceptance step" in line and "--accept a=1:L1,3:L3 --accept b=1:L1,3:L3" in line
    (run_dir / "trace/closed_loop.json").unlink()
    assert "run the trace step first" in error()
    assert "no such folder; give a GPU harness run's --run-dir" in error(run=run_dir / "nope")
    with pytest.raises(SystemExit) as bad:
        cli.main([str(run_dir), "--seeds", "0,x"])
    assert bad.value.code == 2 and "--seeds" in capsys.readouterr().err


@pytest.mark.slow
def test_the_scenario_file_runs_in_specctl_sim_evaluate(run_dir):
    """What the command writes beside its results reruns the daemon's part on its own."""
    assert cli.main([str(run_dir), "--profile", "h200-llama8b-eagle3",
                     "--accept", f"b={_family_a(run_dir)}"]) == 0  # fmt: skip
    scenario = yaml.safe_load((run_dir / "trace/sim_scenario.yaml").read_text())
    assert scenario["daemon"]["schedule"]["scrape_interval_s"] == scenario["sample_interval_s"]
    done = subprocess.run(
        [sys.executable, "-m", "controller.cli", "sim", "evaluate", "--json",
         "--profile", str(run_dir / "trace/sim_profile.yaml"),
         "--scenario", str(run_dir / "trace/sim_scenario.yaml"),
         "--seed-bench", str(run_dir / "bench")],
        capture_output=True, text=True, timeout=300, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    sim = _closed(run_dir, "sim_closed_loop.json")["policies"]
    clock = load_bench(run_dir / "bench/bench.json").spec.speedup
    # the same daemon from the same bench on the same seed: the command's daemon-from-bench
    assert report["achieved_tok_per_s"] * clock == pytest.approx(sim["daemon-from-bench"][0],
                                                                 abs=0.1)  # fmt: skip
    assert report["seed_bench"] == str(run_dir / "bench")


def test_the_trace_s_output_lengths_are_a_range_only_where_they_spread_evenly(tmp_path):
    """As `specctl sim fit` frames a bench: the asked lengths' range where their mean sits in
    its middle, else their mean (a skewed spread is not uniform); a fixed length as is."""
    from sims.workload import FixedLength, UniformLength

    def folder(name: str, low: int, high: int, mean: float) -> Path:
        out = tmp_path / name
        out.mkdir()
        phase = {"prompt_tokens_mean": 40.0, "max_tokens_min": low, "max_tokens_max": high,
                 "max_tokens_mean": mean, "completed": 10}  # fmt: skip
        (out / "static-3.json").write_text(json.dumps({"trace": [], "phases": [phase]}))
        return out

    even = trace_lengths(folder("even", 64, 192, 130.0))
    skewed = trace_lengths(folder("skewed", 64, 192, 90.0))
    fixed = trace_lengths(folder("fixed", 128, 128, 128.0))
    assert even is not None and skewed is not None and fixed is not None
    assert even[1] == UniformLength(low=64, high=192)
    assert skewed[1] == FixedLength(value=90)
    assert fixed == (FixedLength(value=40), FixedLength(value=128))


def test_a_scrape_measurement_is_not_simulated_and_says_why():
    """static:D+scrape measures what reading /metrics costs the real server: the simulator
    has no counterpart, and says so before it needs a profile or a scenario."""
    from benchmarks.gpu.sim_trace.policies import NotSimulated, run_policy

    with pytest.raises(NotSimulated, match="reading /metrics"):
        run_policy("static:3+scrape", None, None, 0, Path("bench"))  # type: ignore[arg-type]


def test_the_report_reads_the_five_percent_check_against_the_real_runs_own_noise():
    """Two runs a policy that spread by 8% leave each real mean uncertain by more than 5%: the
    report says whether each simulated figure lies inside that interval, counting runs a
    policy shares with another (same_runs) once."""
    from benchmarks.gpu.sim_trace import report

    real = {"static:1": [100.0, 108.0], "static:3": [90.0, 96.0], "bench-table": [90.0, 96.0]}
    sim = {"static:1": [98.0], "static:3": [87.0], "bench-table": [87.0]}
    table = report.rows(real, sim, {})
    assert not report.tolerance_check(table).met  # static:3 at 0.935
    found = report.noise_check(table, real, {"bench-table"})
    assert found is not None
    check, spread = found
    sd = math.sqrt((16 + 16 + 9 + 9) / 2)  # static:1 and static:3 once each: 2 degrees
    half = stats.t.ppf(0.975, 2) * sd / math.sqrt(2)
    assert check.met and f"sd {sd:,.0f} tok/s" in spread and "2 degrees of freedom" in spread
    assert f"+-{half / 104:.1%} to +-{half / 93:.1%}" in spread
    text = report.render(table, ["# x"], real, {"bench-table"})
    assert "- tok/s inside the real mean's 95% interval per policy: met" in text
    tight = {"static:1": [100.0, 100.2], "static:3": [93.0, 93.2]}
    missed, _ = report.noise_check(report.rows(tight, sim, {}), tight) or (None, "")
    assert missed is not None and not missed.met and missed.worst.startswith("static:3")
    assert report.noise_check(table, {"static:1": [100.0], "static:3": [93.0]}) is None
