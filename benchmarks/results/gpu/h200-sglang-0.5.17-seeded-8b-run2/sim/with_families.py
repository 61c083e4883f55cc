"""A fitted profile with the two served prompt families as acceptance phases `a` and `b`.

    python benchmarks/results/gpu/h200-sglang-0.5.17-seeded-8b-run2/sim/with_families.py \
        FITTED.yaml ../acceptance/skip-extend.json OUT.yaml

Per-position rates from the served accept lengths at depths 1 and 3 (L1 = 1 + p1,
L3 = 1 + p1 + p1 p + p1 p^2, the later positions taken alike).
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import yaml


def rates(l1: float, l3: float) -> list[float]:
    p1 = l1 - 1.0
    rest = (l3 - 1.0) / p1 - 1.0  # p + p^2
    p = (-1.0 + math.sqrt(1.0 + 4.0 * rest)) / 2.0
    return [round(p1, 4), round(p, 4), round(p, 4)]


def main(fitted: str, acceptance: str, out: str) -> None:
    profile = yaml.safe_load(Path(fitted).read_text())
    families = json.loads(Path(acceptance).read_text())["families"]
    phases = {}
    for name, fam in families.items():
        lengths = {row["depth"]: row["accept_length"] for row in fam["depths"]}
        phases[name.removeprefix("family_")] = rates(lengths[1], lengths[3])
    profile["name"] = f"{profile['name']}-families"
    profile["acceptance"] = {"phases": phases, "default_phase": "a"}
    profile.setdefault("sources", []).append(
        f"Acceptance phases a and b: served accept lengths at depths 1 and 3 in {acceptance}")
    Path(out).write_text(yaml.safe_dump(profile, sort_keys=False))
    print(f"{out}: phases {phases}")


if __name__ == "__main__":
    main(*sys.argv[1:4])
