"""The GPU harness's closed-loop trace replayed in the simulator of the run's server, and the
two side by side (the manual: benchmarks/gpu/sim_trace/__init__.py; docs/daemon.md, "On a
real server").

    python -m benchmarks.gpu.sim_trace RUN_DIR [--seeds 0,1,2] [--profile FILE] [--accept ...]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path
from statistics import fmean
from typing import Any, NoReturn

import yaml

from benchmarks.gpu.sim_trace import inputs, policies, profile, report
from benchmarks.gpu.sim_trace.inputs import SimTraceError
from benchmarks.gpu.sim_trace.scenario import harness_daemon, trace_scenario
from controller.cli.sim_fit import DEFAULT_BASE
from sims.fit.bench_file import BenchRun
from sims.fit.fitting import SEARCH_EVALUATIONS
from sims.profile import Profile
from sims.workload import FixedLength, LengthDist, Scenario, UniformLength

PROG = "python -m benchmarks.gpu.sim_trace"
PROFILE_FILE, SCENARIO_FILE = "sim_profile.yaml", "sim_scenario.yaml"
RESULT_FILE, COMPARE_FILE = "sim_closed_loop.json", "sim_compare.md"


class OneLineParser(argparse.ArgumentParser):
    """Bad usage is one line on stderr and exit status 2, not the usage text."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see {PROG} --help)", file=sys.stderr)
        sys.exit(2)


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        seeds = []
    if not seeds or min(seeds) < 0 or len(set(seeds)) != len(seeds):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct seeds >= 0, e.g. 0,1,2")
    return seeds


def _tokens(text: str) -> LengthDist:
    low, _, high = text.partition(":")
    try:
        lo, hi = int(low), int(high or low)
    except ValueError:
        lo = hi = 0
    if lo < 1 or hi < lo:
        raise argparse.ArgumentTypeError(f"{text!r}: give N or LOW:HIGH tokens, N >= 1")
    return FixedLength(value=lo) if lo == hi else UniformLength(low=lo, high=hi)


def _at_least(low: int) -> Any:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = low - 1
        if value < low:
            raise argparse.ArgumentTypeError(f"{text!r}: give a whole number >= {low}")
        return value

    return parse


def parser() -> argparse.ArgumentParser:
    ap = OneLineParser(prog=PROG, description=" ".join((__doc__ or "").split("\n\n")[0].split()))
    ap.add_argument("run_dir", type=Path, metavar="RUN_DIR",
                    help="a GPU harness run folder with the bench, acceptance and trace steps")
    ap.add_argument("--bench", type=Path, default=None, metavar="DIR",
                    help="the bench fitted and run by the bench policies (default RUN_DIR/bench)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help=f"use this profile instead of fitting one (e.g. the {PROFILE_FILE} of "
                    "an earlier run of this command)")
    ap.add_argument("--base", default=DEFAULT_BASE, metavar="PROFILE",
                    help="the fit's base profile (specctl sim fit --base)")
    ap.add_argument("--accept", action="append", default=[], metavar="NAME=D:L,...",
                    help="a dataset's accept length per depth, e.g. a=1:1.82,3:3.05, instead "
                    "of the acceptance step's (repeat per dataset)")
    ap.add_argument("--seeds", type=_seeds, default=[0],
                    help="simulator seeds, averaged (default 0)")
    ap.add_argument("--prompt-tokens", type=_tokens, default=None, metavar="N",
                    help="prompt length of the trace's requests (default: what the trace "
                    "sent, as its policies' files record it, else the bench's)")
    ap.add_argument("--output-tokens", type=_tokens, default=None, metavar="N|LOW:HIGH",
                    help="output length of the trace's requests (default: as the prompt's)")
    ap.add_argument("--fit-evaluations", type=_at_least(profile.MIN_EVALUATIONS),
                    default=SEARCH_EVALUATIONS, metavar="N",
                    help="the fit's search budget (replays of every level); fewer is quicker "
                    f"and rougher (default {SEARCH_EVALUATIONS})")
    ap.add_argument("--jobs", type=_at_least(1), default=1, metavar="N",
                    help="processes replaying the bench's levels while fitting")
    return ap


def _say(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def _shape(text: LengthDist) -> str:
    if isinstance(text, UniformLength):
        return f"{text.low}-{text.high}"
    return f"{text.mean:g}"


def write_scenario(scenario: Scenario, path: Path) -> None:
    data = scenario.model_dump(mode="json", exclude_none=True)
    path.write_text(f"# {scenario.name}: written by {PROG}; `specctl sim evaluate --scenario "
                    "THIS_FILE` runs it\n" + yaml.safe_dump(data, sort_keys=False, width=100))


def _profile(args: argparse.Namespace, bench_path: Path, bench: BenchRun,
             lengths: dict[str, dict[int, float]], source: str, out: Path
             ) -> tuple[Profile, str]:  # fmt: skip
    """The server's profile with the trace's datasets, as written to `out`; how it was made."""
    if args.profile is not None:
        base, made = profile.given(args.profile), f"the profile {args.profile}"
    else:
        _say(f"fitting a profile to {bench_path} (specctl sim fit; minutes at the default "
             "--fit-evaluations)")
        base = profile.fitted(bench, args.base, f"{args.run_dir.name}-sim-trace",
                              args.fit_evaluations, args.jobs, lambda m: _say(f"  fit: {m}"))
        made = f"specctl sim fit of {bench_path} (base {args.base})"
    # simulated as written (rounded), so that the files alone rerun it
    return profile.written(profile.with_datasets(base, lengths, source), out), made


def _lengths(args: argparse.Namespace, folder: Path, bench: BenchRun
             ) -> tuple[LengthDist, LengthDist, str]:  # fmt: skip
    """Prompt and output lengths of the trace's requests, and where they came from."""
    if args.prompt_tokens and args.output_tokens:  # both given: no file is read for them
        return args.prompt_tokens, args.output_tokens, "given"
    sent = inputs.trace_lengths(folder)
    prompt, output = sent or inputs.request_lengths(bench)
    origin = "the trace's" if sent else "the bench's: the trace did not record its own"
    if args.prompt_tokens or args.output_tokens:
        prompt, output = args.prompt_tokens or prompt, args.output_tokens or output
        origin = "given, the rest " + origin
    return prompt, output, origin


@dataclass
class Simulated:
    tok_per_s: dict[str, list[float]] = field(default_factory=dict)  # per seed
    phases: dict[str, list[float]] = field(default_factory=dict)  # per phase, mean of seeds
    notes: dict[str, str] = field(default_factory=dict)  # not simulated, with why
    order: list[str] = field(default_factory=list)


def _simulate(names: list[str], prof: Profile, scenario: Scenario, seeds: list[int],
              bench_path: Path, clock: float) -> Simulated:  # fmt: skip
    """Each policy's tok/s per seed and per phase (per wall second of the run's servers, as
    closed_loop.json counts), the policies not simulated with why, and the order they ran in."""
    out = Simulated()
    for name in names:
        runs = []
        for seed in seeds:
            try:
                run = policies.run_policy(name, prof, scenario, seed, bench_path)
            except policies.NotSimulated as why:
                out.notes[name] = str(why)
                _say(f"  {name}: not simulated: {why}")
                break
            runs.append(run)
            out.tok_per_s.setdefault(name, []).append(round(run.tok_per_s * clock, 1))
            out.order.append(f"{name} (seed {seed})")
            _say(f"  {name}, seed {seed}: {out.tok_per_s[name][-1]:,.1f} tok/s")
        if runs:
            out.phases[name] = [round(fmean(ph) * clock, 1)
                                for ph in zip(*(r.phases for r in runs), strict=True)]
    return out


def run(args: argparse.Namespace) -> str:
    """Everything the module's docstring lists; returns the comparison's text."""
    run_dir: Path = args.run_dir
    if not run_dir.is_dir():
        raise SimTraceError(f"{run_dir}: no such folder; give a GPU harness run's --run-dir")
    trace = inputs.read_trace(run_dir)
    bench_path, bench = inputs.read_bench(run_dir, args.bench)
    clock = bench.spec.speedup  # 1 on a GPU; a `specctl sim serve` run's speedup
    names = list(dict.fromkeys(p.dataset for p in trace.phases))
    given = dict(inputs.parse_accept(text) for text in args.accept)
    for name in given:
        if name not in names:
            raise SimTraceError(f"--accept {name}=...: the trace has no dataset {name!r} (its "
                                f"datasets: {', '.join(names)})")  # fmt: skip
    lengths, source = inputs.accept_lengths(run_dir, names, trace.files, given)
    prof, made = _profile(args, bench_path, bench, lengths, source, trace.folder / PROFILE_FILE)
    prompt, output, origin = _lengths(args, trace.folder, bench)
    scenario = trace_scenario(trace.phases, prompt_tokens=prompt, output_tokens=output,
                              daemon=harness_daemon(clock), clock=clock,
                              name=f"{run_dir.name}-trace")  # fmt: skip
    write_scenario(scenario, trace.folder / SCENARIO_FILE)
    simulated = _simulate(list(trace.policies), prof, scenario, args.seeds, bench_path, clock)
    sim, notes, order = simulated.tok_per_s, simulated.notes, simulated.order

    total = sum(p.seconds for p in trace.phases)
    header = [
        f"# The GPU trace of {run_dir.name}, simulated",
        "",
        f"- trace: {trace.doc.get('phases')} ({total:g} s), GPU: {trace.doc.get('gpu') or '-'}; "
        f"real: closed_loop.json, mean of its repeats",
        f"- simulated: seeds {', '.join(map(str, args.seeds))} on {PROFILE_FILE} ({made}); "
        f"acceptance per dataset from {source}; requests of {_shape(prompt)} prompt and "
        f"{_shape(output)} output tokens ({origin}); the daemon with the trace's settings "
        "(benchmarks/gpu/daemon_run.py)",
    ]
    if clock != 1.0:
        header.append(f"- the run's servers were `specctl sim serve` at {clock:g}x wall time: "
                      "the simulated tok/s are per wall second, as the trace's")
    text = report.render(report.rows(trace.policies, sim, notes), header, trace.policies,
                         trace.same_runs)
    real_phases = inputs.real_phases(trace)
    if real_phases:
        text += "\n\n" + report.render_phases(trace.phases, real_phases, simulated.phases)
    (trace.folder / COMPARE_FILE).write_text(text + "\n")
    doc = {"source": "simulator", "gpu": trace.doc.get("gpu"), "trace": trace.doc.get("trace"),
           "phases": trace.doc.get("phases"), "repeats": len(args.seeds), "seeds": args.seeds,
           "order": order, "policies": sim, "not_simulated": notes,
           "phase_tok_per_s": simulated.phases,
           "profile": {"file": PROFILE_FILE, "name": prof.name, "from": made},
           "scenario": SCENARIO_FILE,
           "accept_lengths": {n: {str(d): v for d, v in sorted(per.items())}
                              for n, per in lengths.items()},
           "clock": clock}  # fmt: skip
    (trace.folder / RESULT_FILE).write_text(json.dumps(doc, indent=1) + "\n")
    return text


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        text = run(args)
    except SimTraceError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
