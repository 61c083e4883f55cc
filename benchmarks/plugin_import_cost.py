"""What loading the plugin costs every SGLang process at start-up: modules imported and seconds.

SGLang calls `load_plugins()` early in each of its processes (launcher, schedulers,
detokenizer, DP controller). This starts fresh interpreters that do only that, with the
specctl plugin enabled (`SGLANG_PLUGINS=specctl`) and with no plugin enabled
(`SGLANG_PLUGINS=` a name no plugin has), and prints the SGLang modules each ends up with
and the wall time of `load_plugins()`. The difference is what specctl adds to a process
that never touches the hooked classes (e.g. the detokenizer); a scheduler imports those
modules anyway, and the plugin patches them when it does.

Runs in .venv-sglang (CPU): the GPU-only imports get the test stand-ins
(tests/sglang/standins.py), the same way the plugin tests run.

Run: .venv-sglang/bin/python benchmarks/plugin_import_cost.py [--runs 5] [--plugin-src DIR]
(`--plugin-src`: a folder holding another version of the `sglang_hooks` package, e.g. an
earlier commit's, imported in place of the installed one, to compare before and after.)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET_EXTRA_MODULES = 5  # SGLang modules the plugin may add to a process that hooks nothing

_CHILD = r"""
import json, sys, time
sys.path.insert(0, {standins!r})
import standins
standins.install()
if {plugin_src!r}:
    sys.path.insert(0, {plugin_src!r})
    import sglang_hooks  # the entry point then loads this copy's submodules
    assert sglang_hooks.__file__.startswith({plugin_src!r}), sglang_hooks.__file__
def sglang_modules():
    return {{m for m in sys.modules if m == "sglang" or m.startswith("sglang.")}}
before = sglang_modules()
t0 = time.perf_counter()
from sglang.srt.plugins import load_plugins
load_plugins()
seconds = time.perf_counter() - t0
after = sglang_modules()
print(json.dumps({{"seconds": seconds, "modules": len(after - before),
                  "scheduler": "sglang.srt.managers.scheduler" in after}}))
"""


def run_once(plugins: str, plugin_src: str = "") -> dict[str, float]:
    env = {**os.environ, "SGLANG_PLUGINS": plugins}
    code = _CHILD.format(standins=str(ROOT / "tests" / "sglang"), plugin_src=plugin_src)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--plugin-src", default="", help="folder with another sglang_hooks copy")
    args = ap.parse_args()
    src = str(Path(args.plugin_src).resolve()) if args.plugin_src else ""
    cases = (("no plugin", "no-such-plugin"), ("specctl", "specctl"))
    rows: dict[str, list[dict[str, float]]] = {label: [] for label, _ in cases}
    for _ in range(args.runs):  # interleaved: the machine's load drifts between runs
        for label, plugins in cases:
            rows[label].append(run_once(plugins, src))
    for label, _ in cases:
        runs = rows[label]
        secs = statistics.median(r["seconds"] for r in runs)
        mods = statistics.median(r["modules"] for r in runs)
        sched = all(r["scheduler"] for r in runs)
        print(f"{label:>9}: load_plugins() imports {mods:.0f} sglang modules, median "
              f"{secs:.2f} s over {args.runs} runs; imports the scheduler: {sched}")
    extra = (statistics.median(r["modules"] for r in rows["specctl"])
             - statistics.median(r["modules"] for r in rows["no plugin"]))
    print(f"python {platform.python_version()}, {os.cpu_count()} cores; the plugin adds "
          f"{extra:.0f} SGLang modules (target <= {TARGET_EXTRA_MODULES})")
    print(f"result: {'PASS' if extra <= TARGET_EXTRA_MODULES else 'FAIL'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
