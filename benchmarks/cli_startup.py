"""How long `specctl` takes to answer before it does any work: `--help` and a few command helps.

Each case runs `python -m controller.cli ...` in a fresh interpreter `--repeats` times and
prints the best and median wall seconds and the child's CPU seconds (user + system; less
sensitive than wall time to other work on a shared machine), and which heavy packages the
interpreter had imported by the time it exited.

    .venv/bin/python benchmarks/cli_startup.py [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

CASES = (
    ("--help",),
    ("bench", "--help"),
    ("curves", "--help"),
    ("sim", "sweep", "--help"),
)
HEAVY = ("sklearn", "scipy", "matplotlib", "numpy", "pandas", "fastapi", "uvicorn", "httpx")

# Runs the CLI as the console script does, then reports the heavy packages it had imported.
PROBE = (
    "import atexit, sys\n"
    "heavy = {heavy!r}\n"
    "atexit.register(lambda: sys.stderr.write('HEAVY ' + ' '.join("
    "m for m in heavy if m in sys.modules) + '\\n'))\n"
    "sys.argv = ['specctl', *{args!r}]\n"
    "import controller\n"
    "sys.stderr.write('TREE ' + controller.__file__ + '\\n')\n"
    "from controller.cli import main\n"
    "main()\n"
)


def run_once(args: tuple[str, ...], tree: Path) -> tuple[float, float, list[str]]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", PROBE.format(heavy=HEAVY, args=args)],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "100"},
        cwd=tree,  # `python -c` puts the working folder first on sys.path
        check=False,
    )
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"specctl {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    loaded = next(ln.split(" ", 1)[1] for ln in proc.stderr.splitlines() if ln.startswith("TREE"))
    if not Path(loaded).resolve().is_relative_to(tree.resolve()):
        raise SystemExit(f"the probe imported {loaded}, not the sources under {tree}")
    heavy = next(
        (ln.split()[1:] for ln in proc.stderr.splitlines() if ln.startswith("HEAVY")), []
    )
    return wall, cpu, heavy


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    args = ap.parse_args()
    load = os.getloadavg()[0]
    print(
        f"# {platform.python_implementation()} {platform.python_version()}, "
        f"{os.cpu_count()} cores visible, load average {load:.1f} at start "
        f"(other work shares this machine); {args.repeats} runs per case; sources: {args.tree}"
    )
    print(f"{'command':<26} {'wall best':>9} {'median':>7} {'CPU best':>8} {'median':>7}  imported")
    for case in CASES:
        runs = [run_once(case, args.tree) for _ in range(args.repeats)]
        walls = [r[0] for r in runs]
        cpus = [r[1] for r in runs]
        heavy = " ".join(runs[-1][2]) or "-"
        print(
            f"{'specctl ' + ' '.join(case):<26} {min(walls):>9.2f} {statistics.median(walls):>7.2f}"
            f" {min(cpus):>8.2f} {statistics.median(cpus):>7.2f}  {heavy}",
            flush=True,
        )


if __name__ == "__main__":
    main()
