"""The version guard against real SGLang sources: 0.5.23 (installed) and 0.5.17 (unpacked)."""

from __future__ import annotations

import shutil
from pathlib import Path

from sglang_hooks import guard


def test_guard_accepts_installed_0_5_23_with_its_adapter() -> None:
    result = guard.evaluate()
    assert result.version == "0.5.23"
    assert result.adapter is not None and result.adapter.name == "sglang-0.5.23", result.reason


def test_guard_accepts_0_5_17_source_with_its_adapter(sglang17_root: Path) -> None:
    result = guard.evaluate(sglang17_root)
    assert result.version == "0.5.17"
    assert result.adapter is not None and result.adapter.name == "sglang-0.5.17", result.reason


def test_every_hooked_symbol_exists_in_both_sources_and_in_the_live_classes(
    sglang17_root: Path,
) -> None:
    import importlib
    import inspect

    for root, name in ((guard.sglang_root(), "sglang-0.5.23"), (sglang17_root, "sglang-0.5.17")):
        assert root is not None
        adapter = next(a for a in guard.ADAPTERS if a.name == name)
        for sym in adapter.symbols():
            assert guard.check_symbol(root, sym) is None, (name, sym.where)
    # And by inspect on the imported 0.5.23 classes (what HookRegistry will resolve).
    adapter = next(a for a in guard.ADAPTERS if a.name == "sglang-0.5.23")
    for spec in adapter.hooks:
        module, cls, method = spec.target.rsplit(".", 2)
        loaded = importlib.import_module(module)
        obj = getattr(getattr(loaded, cls), method)
        fn = inspect.unwrap(obj)
        params = list(inspect.signature(fn).parameters)[1:]
        assert params[: len(spec.symbol.params)] == list(spec.symbol.params), spec.target
        assert inspect.iscoroutinefunction(fn) == spec.symbol.is_async, spec.target


def test_guard_refuses_a_changed_signature_naming_symbol_and_versions(
    sglang17_root: Path, tmp_path: Path
) -> None:
    root = tmp_path / "sglang"
    shutil.copytree(sglang17_root / "srt" / "speculative", root / "srt" / "speculative")
    for sub in ("managers", "observability"):
        shutil.copytree(sglang17_root / "srt" / sub, root / "srt" / sub)
    shutil.copy(sglang17_root / "_version.py", root / "_version.py")
    target = root / "srt" / "speculative" / "adaptive_spec_params.py"
    text = target.read_text()
    target.write_text(text.replace("def get_steps_for_batch(self, batch_size: int)",
                                   "def get_steps_for_batch(self, bs: int)"))
    result = guard.evaluate(root)
    assert result.adapter is None
    assert result.reason is not None
    assert "AdaptiveSpeculativeParams.get_steps_for_batch" in result.reason
    assert "0.5.17 to 0.5.23" in result.reason


def test_guard_refuses_an_unsupported_version(sglang17_root: Path) -> None:
    result = guard.evaluate(sglang17_root, version="0.5.16")
    assert result.adapter is None and "0.5.16 is not supported" in (result.reason or "")
