"""Loading the plugin imports no hooked SGLang module; each is patched when it is imported.

Each case runs in a fresh interpreter (SGLang's `load_plugins()` runs once per process and
its patches cannot be undone), with the real plugin entry point, SGLang 0.5.23's real
loader and HookRegistry, and the GPU-only imports stood in as in the rest of this folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.gpu.servers import NO_PLUGINS
from sglang_hooks import guard

HERE = Path(__file__).parent
ADAPTER = next(a for a in guard.ADAPTERS if a.name == "sglang-0.5.23")
HOOKED_MODULES = sorted({spec.target.rsplit(".", 2)[0] for spec in ADAPTER.hooks})

_SCRIPT = """
import importlib, json, sys
sys.path.insert(0, {here!r})
import standins
standins.install()
for name in {before!r}:
    importlib.import_module(name)
from sglang.srt.plugins import load_plugins
load_plugins()
after_load = sorted(m for m in {watch!r} if m in sys.modules)
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2
print(json.dumps({{
    "after_load": after_load,
    "choice_patched": hasattr(AdaptiveSpeculativeParams.get_steps_for_batch, "__wrapped__"),
    "switch_patched": hasattr(EAGLEWorkerV2.apply_runtime_state, "__wrapped__"),
}}))
"""


def _run(before: list[str], plugins: str = "specctl") -> dict[str, Any]:
    watch = [*HOOKED_MODULES, "sglang.srt.managers.scheduler"]
    code = _SCRIPT.format(here=str(HERE), before=before, watch=watch)
    env = {**os.environ, "SGLANG_PLUGINS": plugins}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_register_imports_no_hooked_module_and_patches_them_on_import() -> None:
    got = _run(before=[])
    assert got["after_load"] == [], "load_plugins() imported modules the plugin hooks"
    assert got["choice_patched"] and got["switch_patched"]


def test_a_module_imported_before_the_plugin_is_patched_at_once() -> None:
    got = _run(before=["sglang.srt.speculative.adaptive_spec_params"])
    assert got["after_load"] == ["sglang.srt.speculative.adaptive_spec_params"]
    assert got["choice_patched"] and got["switch_patched"]


def test_the_gpu_harness_plain_server_environment_installs_no_hook() -> None:
    """The GPU harness starts its plain server with NO_PLUGINS in its environment, so that the
    baseline is SGLang as released: the real loader then installs none of the plugin's hooks."""
    got = _run(before=[], plugins=NO_PLUGINS["SGLANG_PLUGINS"])
    assert not got["choice_patched"] and not got["switch_patched"]
