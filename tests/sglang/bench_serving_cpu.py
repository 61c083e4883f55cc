"""SGLang's own benchmark client (`python -m sglang.bench_serving`) run on a CPU box.

`import sglang` needs triton and torchvision, which no CPU build provides: standins.py puts
SGLang's own triton stand-in and an empty torchvision in their place, as for the plugin's tests.
The client's dataset registry also imports `datasets` (Hugging Face's, for datasets the CPU
tests never load): an empty placeholder takes its name. Everything else, the client included,
is SGLang's code as released.

    .venv-sglang/bin/python tests/sglang/bench_serving_cpu.py --backend sglang-oai ...
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import standins

if __name__ == "__main__":
    standins.install()
    sys.modules.setdefault("datasets", standins._PlaceholderModule("datasets"))
    sys.argv = ["sglang.bench_serving", *sys.argv[1:]]
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)
