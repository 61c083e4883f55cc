"""SGLang's own benchmark client (`python -m sglang.bench_serving`), runnable where Hugging
Face's `datasets` package is not installed.

SGLang 0.5.17's client imports `datasets` when it loads its dataset registry (for the MMMU
dataset), even when it reads a custom prompt file; a GPU box without that package then cannot
start the client at all. Where the package is missing, a placeholder takes its name whose
functions say so when called; everything else is SGLang's client as released.

    python -m benchmarks.gpu.sglang_client --backend sglang-oai --base-url URL ...
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
import types
from typing import Any, NoReturn


class _MissingDatasets(types.ModuleType):
    """`datasets` where it is not installed: importing a name works, calling it says why."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)

        def unavailable(*args: Any, **kwargs: Any) -> NoReturn:
            raise RuntimeError(f"datasets.{name}: Hugging Face's `datasets` is not installed; "
                               "use a prompt file (--dataset-name custom)")

        return unavailable


def main(argv: list[str]) -> None:
    if importlib.util.find_spec("datasets") is None:
        sys.modules["datasets"] = _MissingDatasets("datasets")
    sys.argv = ["sglang.bench_serving", *argv]
    runpy.run_module("sglang.bench_serving", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
