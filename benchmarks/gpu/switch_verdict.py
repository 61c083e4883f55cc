"""Did a switch phase fail only because its budget ran out before the last push?

    python -m benchmarks.gpu.switch_verdict RUN/summary.json

Exit 0 and one line saying how many pushes were sent when the phase's only failed check is
"all N pushes sent" and it stopped for time; exit 1 (and the failed checks) otherwise: a push
refused, a hang, a failed request, memory growth or a greedy flip, or no switch phase at all.
The session script keeps the host-work trims on in the first case, off in the second.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def cut_short_only(phase: dict[str, Any]) -> tuple[bool, str]:
    """(only the push count failed, a line saying so or naming what failed)."""
    result = phase.get("result")
    if not isinstance(result, dict) or not isinstance(result.get("checks"), dict):
        return False, "no switch result"
    failed = [name for name, ok in result["checks"].items() if ok is False]
    count_check = f"all {result.get('switches_planned')} pushes sent"
    if failed == [count_check] and result.get("stopped_early"):
        return True, (f"switch phase cut short ({result['stopped_early']}); every other check "
                      f"passed, greedy identical")
    return False, "failed: " + (", ".join(failed) or "no check failed, the phase errored")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.switch_verdict",
                                 description=__doc__.split("\n\n")[0])
    ap.add_argument("summary", type=Path, help="the harness's summary.json")
    args = ap.parse_args(argv)
    try:
        phase = json.loads(args.summary.read_text())["phases"]["switch"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        print(f"no switch phase in {args.summary}: {err}", file=sys.stderr)
        return 1
    ok, line = cut_short_only(phase)
    print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
