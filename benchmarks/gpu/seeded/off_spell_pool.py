"""Pool several off-spell measurements (`acceptance --off-spell`) into one accept length per arm.

    python -m benchmarks.gpu.seeded.off_spell_pool --setting skip1 A/prefill_skip_1_*.json \
        --setting skip0 A/prefill_skip_0_*.json [--json OUT]

Each --setting LABEL FILE... is one setting of the server. For each setting and arm the accept
length is pooled as tokens over request steps across the rounds (each round's tokens are its
accept length times its steps), and the loss (on throughout minus off then on) is given pooled
and round by round: one round of eight requests resolves about 0.05, so the rounds' spread
says how far the pooled loss can be trusted.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARMS = ("on_throughout", "off_then_on")


class PoolError(ValueError):
    """A file is not an off-spell result; the message names it."""


@dataclass
class Pooled:
    label: str
    rounds: int
    accept: dict[str, float]  # arm -> pooled accept length
    steps: dict[str, float]  # arm -> request steps pooled
    losses: list[float]  # round by round

    @property
    def loss(self) -> float:
        return self.accept["on_throughout"] - self.accept["off_then_on"]


def _spell(path: Path) -> dict[str, Any]:
    try:
        spell = json.loads(path.read_text()).get("off_spell")
    except (OSError, json.JSONDecodeError) as err:
        raise PoolError(f"{path}: cannot read it as JSON ({err})") from None
    if not isinstance(spell, dict) or any(
        not isinstance(spell.get(arm), dict) or not spell[arm].get("request_steps")
        or spell[arm].get("accept_length") is None for arm in ARMS
    ):  # fmt: skip
        raise PoolError(
            f"{path}: no measured off spell in it (run `acceptance --off-spell N`; an arm whose "
            "requests ended before the push has no accept length)"
        )
    return spell


def pool(label: str, paths: list[Path]) -> Pooled:
    spells = [_spell(p) for p in paths]
    accept, steps = {}, {}
    for arm in ARMS:
        steps[arm] = sum(s[arm]["request_steps"] for s in spells)
        tokens = sum(s[arm]["accept_length"] * s[arm]["request_steps"] for s in spells)
        accept[arm] = tokens / steps[arm]
    losses = [s["on_throughout"]["accept_length"] - s["off_then_on"]["accept_length"]
              for s in spells]  # fmt: skip
    return Pooled(label, len(spells), accept, steps, losses)


def render(groups: list[Pooled]) -> str:
    lines = ["| setting | rounds | on throughout | off then on | loss | loss by round |",
             "| --- | ---: | ---: | ---: | ---: | --- |"]  # fmt: skip
    for g in groups:
        by_round = " ".join(f"{x:+.3f}" for x in g.losses)
        lines.append(f"| {g.label} | {g.rounds} | {g.accept['on_throughout']:.4f} | "
                     f"{g.accept['off_then_on']:.4f} | {g.loss:+.4f} | {by_round} |")  # fmt: skip
    return "\n".join(lines)


def _groups(raw: list[list[str]]) -> list[tuple[str, list[Path]]]:
    out = []
    for label, *files in raw:
        if not files:
            raise PoolError(f"--setting {label}: give its files after the label")
        out.append((label, [Path(f) for f in files]))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--setting", action="append", nargs="+", required=True,
                        metavar="LABEL FILE", help="a label, then that setting's result files")
    parser.add_argument("--json", type=Path, default=None, help="also write the pooled figures")
    args = parser.parse_args(argv)
    try:
        groups = [pool(label, paths) for label, paths in _groups(args.setting)]
    except PoolError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(groups))
    if args.json:
        args.json.write_text(json.dumps([
            {"setting": g.label, "rounds": g.rounds, "accept_length": g.accept,
             "request_steps": g.steps, "loss": round(g.loss, 4),
             "loss_by_round": [round(x, 4) for x in g.losses]}
            for g in groups
        ], indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
