"""Does the daemon beat the fixed choices on a real trace, or is the difference inside the noise?

    python -m benchmarks.gpu.seeded.criterion RUN/trace/closed_loop.json

Over closed_loop.json's policies (tok/s per run), each daemon policy's mean against the best
static depth's or shape's, the bench's frozen table's (at or above each) and SGLang's adaptive
choice's (3% above): the ratio of the means and a 95% interval, the difference of the means'
interval over the other policy's mean. The interval comes from the run-to-run spread pooled
over every policy with repeats, as a trace's runs share one server and one load (two runs of
one policy alone leave one degree of freedom); a policy listed in `same_runs` (its runs are
another's) counts once. A comparison is met
when the whole interval clears the bar, not met when the whole interval falls short, and
inside the noise otherwise: then more runs, not a reading of the means, would decide it.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from statistics import fmean

from scipy import stats

DAEMONS = ("daemon-from-bench", "daemon")
STATIC = re.compile(r"static:\d+")
# (against, margin): the bars of a daemon's mean; "best static" is the best static:* mean
BARS = (("best static", 0.0), ("bench-table", 0.0), ("sglang-adaptive", 0.03))


class CriterionError(ValueError):
    """closed_loop.json content the comparison cannot use; the message names it."""


@dataclass(frozen=True)
class Comparison:
    daemon: str
    against: str  # a policy name (for the best static: which one)
    margin: float  # the daemon's mean must be at least (1 + margin) x the other's
    ratio: float  # daemon mean / other mean
    low: float  # the ratio's 95% interval
    high: float

    @property
    def verdict(self) -> str:
        bar = 1.0 + self.margin
        if self.low >= bar:
            return "met"
        if self.high < bar:
            return "not met"
        return "inside the noise"


def pooled_spread(policies: Mapping[str, Sequence[float]],
                  same_runs: Collection[str] = ()) -> tuple[float, int]:
    """The runs' standard deviation pooled over the policies, and its degrees of freedom;
    `same_runs` names policies whose runs are another policy's, left out so that no run
    counts twice."""
    squares, df = 0.0, 0
    for name, runs in policies.items():
        if len(runs) > 1 and name not in same_runs:
            mean = fmean(runs)
            squares += sum((r - mean) ** 2 for r in runs)
            df += len(runs) - 1
    if df == 0:
        raise CriterionError("no policy has two runs or more: rerun the trace with "
                             "--trace-repeats 2 or more")  # fmt: skip
    return math.sqrt(squares / df), df


def comparisons(policies: Mapping[str, Sequence[float]],
                same_runs: Collection[str] = ()) -> list[Comparison]:
    sd, df = pooled_spread(policies, same_runs)
    t = float(stats.t.ppf(0.975, df))
    # static:D alone: static:D+scrape is a measurement of the scrapes, not a choice of depth
    statics = {n: fmean(r) for n, r in policies.items() if STATIC.fullmatch(n) and r}
    out = []
    for daemon in (d for d in DAEMONS if policies.get(d)):
        runs = policies[daemon]
        for bar, margin in BARS:
            other = max(statics, key=lambda n: statics[n]) if bar == "best static" and statics \
                else bar
            if not policies.get(other):
                continue
            mine, theirs = fmean(runs), fmean(policies[other])
            half = t * sd * math.sqrt(1 / len(runs) + 1 / len(policies[other]))
            out.append(Comparison(daemon, other if bar != "best static" else f"{other} (best "
                                  "static)", margin, mine / theirs, (mine - half) / theirs,
                                  (mine + half) / theirs))  # fmt: skip
    return out


def render(policies: Mapping[str, Sequence[float]], same_runs: Mapping[str, str] | None = None
           ) -> str:  # fmt: skip
    same = same_runs or {}
    sd, df = pooled_spread(policies, same)
    grand = fmean(r for name, runs in policies.items() if name not in same for r in runs)
    lines = [f"Run-to-run spread pooled over the policies: sd {sd:,.0f} tok/s ({sd / grand:.1%} "
             f"of the mean run), {df} degrees of freedom.", "",
             "| daemon | against | bar | ratio of means | 95% interval | verdict |",
             "| --- | --- | ---: | ---: | --- | --- |"]  # fmt: skip
    for c in comparisons(policies, same):
        lines.append(f"| {c.daemon} | {c.against} | {1 + c.margin:.2f} | {c.ratio:.3f} | "
                     f"{c.low:.3f}-{c.high:.3f} | {c.verdict} |")
    lines += ["", *(f"{alias}'s runs are {source}'s (the same table): counted once in the "
                    "spread." for alias, source in same.items())] if same else []
    return "\n".join(lines)


def read_policies(path: Path) -> tuple[dict[str, list[float]], dict[str, str]]:
    """closed_loop.json's tok/s per run of each policy, and its `same_runs`."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CriterionError(f"{path}: not readable as JSON ({err}); give a trace step's "
                             "closed_loop.json") from None  # fmt: skip
    policies = doc.get("policies") if isinstance(doc, dict) else None
    if not isinstance(policies, dict) or not all(
            isinstance(v, list) and all(isinstance(x, int | float) for x in v)
            for v in policies.values()):
        raise CriterionError(f"{path}: 'policies' is not {{name: [tok/s per run]}}")
    same = doc.get("same_runs") or {}
    if not isinstance(same, dict) or not all(isinstance(v, str) and v in policies
                                             for v in same.values()):
        raise CriterionError(f"{path}: 'same_runs' is not {{policy: policy whose runs it "
                             "shares}}")  # fmt: skip
    return ({str(k): [float(x) for x in v] for k, v in policies.items()},
            {str(k): str(v) for k, v in same.items()})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu.seeded.criterion",
                                     description=__doc__.split("\n\n")[0])  # fmt: skip
    parser.add_argument("closed_loop", type=Path, help="a trace step's closed_loop.json")
    args = parser.parse_args(argv)
    try:
        print(render(*read_policies(args.closed_loop)))
    except CriterionError as err:
        print(f"criterion: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
