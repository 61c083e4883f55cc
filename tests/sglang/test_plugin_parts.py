"""Plugin parts that need no SGLang: its settings, the off path each adapter registers, bounded
logs, emitted-token counts and lazy hooking. They run in the main venv (the SGLang-side
behaviour is tested with the real classes in test_real_*.py).

Stand-ins: a throwaway package written to tmp_path stands in for an SGLang module in the
deferred-hook tests (what is under test is the import machinery, not SGLang).
"""

from __future__ import annotations

import importlib
import json
import logging
import sys
import textwrap
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from sglang_hooks import launch, lean_host, override_log, plugin, settings
from sglang_hooks.adapters import ADAPTERS, v0_5_17, v0_5_23
from sglang_hooks.contract import OffPathFeature, PolicyError, PolicyTable, Tier, encode_table
from sglang_hooks.deferred import DeferredHooks, PendingHook
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.runtime import SchedulerRuntime, skippable_tiers, validate_change

# ----------------------------------------------------------------------------- settings




def test_the_off_path_is_the_plugins_unless_the_fallback_is_asked_for(
    fresh_settings: pytest.MonkeyPatch,
) -> None:
    assert settings.OFF_PATH.name == "SPECCTL_OFF_PATH"
    assert settings.OFF_PATH.get() == settings.SPECCTL == "specctl"
    fresh_settings.setenv("SPECCTL_OFF_PATH", "  ")
    assert settings.OFF_PATH.get() == "specctl"  # blank is unset
    fresh_settings.setenv("SPECCTL_OFF_PATH", "sglang")
    assert settings.OFF_PATH.get() == settings.SGLANG == "sglang"
    fresh_settings.setenv("SPECCTL_OFF_PATH", " specctl ")
    assert settings.OFF_PATH.get() == "specctl"


def test_a_bad_off_path_logs_one_line_naming_the_variable_and_keeps_the_default(
    fresh_settings: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    fresh_settings.setenv("SPECCTL_OFF_PATH", "skip-extend")
    with caplog.at_level(logging.ERROR, logger="specctl"):
        assert [settings.OFF_PATH.get() for _ in range(3)] == ["specctl"] * 3
    [line] = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert "SPECCTL_OFF_PATH='skip-extend'" in line and "specctl, sglang" in line
    assert "using 'specctl'" in line and "\n" not in line
    fresh_settings.setenv("SPECCTL_OFF_PATH", "1")  # another bad value: its own line
    with caplog.at_level(logging.ERROR, logger="specctl"):
        assert settings.OFF_PATH.get() == "specctl"
    assert sum("SPECCTL_OFF_PATH='1'" in r.getMessage() for r in caplog.records) == 1


def test_the_policy_file_is_declared_in_the_same_registry(
    fresh_settings: pytest.MonkeyPatch,
) -> None:
    from sglang_hooks.policy_file import POLICY_FILE_ENV, policy_file_from_env

    assert POLICY_FILE_ENV == settings.POLICY_FILE.name == "SPECCTL_POLICY_FILE"
    assert policy_file_from_env() is None
    fresh_settings.setenv("SPECCTL_POLICY_FILE", " /etc/specctl/table.yaml ")
    assert policy_file_from_env() == "/etc/specctl/table.yaml"
    declared = {s.name for s in vars(settings.Environment).values()
                if isinstance(s, settings.Setting)}
    assert declared == {"SPECCTL_OFF_PATH", "SPECCTL_POLICY_FILE", "SPECCTL_SHAPES",
                        "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"}
    assert all(s.why for s in vars(settings.Environment).values()
               if isinstance(s, settings.Setting))


# ----------------------------------------------------------------------------- off path

_OFF_PATH_HOOKS = {  # per piece: the hooks (names in sglang_hooks.hooks) it registers
    OffPathFeature.SKIP_EXTEND: {"skip_extend"},
    OffPathFeature.SKIP_DRAFT_PREFILL: {"skip_draft_prefill"},
    OffPathFeature.PLAIN_DECODE: {"plain_decode_build", "plain_decode_verify"},
    OffPathFeature.HOST_TRIMS: {"lean_trivial_verify", "lean_kv_lens", "lean_prepare",
                                "lean_tokens_required", "lean_free_group_end", "lean_seq_lens",
                                "lean_isolation"},
}
_EVERY_OFF_PATH_HOOK = set().union(*_OFF_PATH_HOOKS.values())


def _hook_names(adapter: Any, path: str) -> set[str]:
    return {spec.hook for spec in plugin.wanted_hooks(adapter, path)}


def test_each_adapter_declares_its_measured_off_path_and_registers_exactly_those_hooks() -> None:
    """0.5.17 runs every piece (the plain decode with its fence, the host-work trims); 0.5.23
    the draft's skipped work only; with the `sglang` fallback no off-path hook is registered
    on either, and every other hook still is."""
    feature = OffPathFeature
    assert v0_5_17.ADAPTER.off_path == set(feature)
    assert v0_5_23.ADAPTER.off_path == {feature.SKIP_EXTEND, feature.SKIP_DRAFT_PREFILL}
    for adapter in (v0_5_17.ADAPTER, v0_5_23.ADAPTER):
        declared = set().union(*(_OFF_PATH_HOOKS[f] for f in adapter.off_path))
        ours = _hook_names(adapter, settings.SPECCTL)
        assert ours & _EVERY_OFF_PATH_HOOK == declared, adapter.name
        assert {spec.hook for spec in adapter.hooks} & _EVERY_OFF_PATH_HOOK == declared
        fallback = _hook_names(adapter, settings.SGLANG)
        assert not fallback & _EVERY_OFF_PATH_HOOK, adapter.name
        assert fallback == ours - declared and "choose_depth" in fallback
        assert plugin.off_path_features(adapter, settings.SGLANG) == frozenset()
    assert "lean_trivial_verify" not in {spec.hook for spec in v0_5_23.ADAPTER.hooks}


def test_a_piece_the_adapter_does_not_declare_is_not_registered() -> None:
    """An adapter listing a piece's hooks without declaring the piece registers none of them."""
    undeclared = replace(v0_5_17.ADAPTER, off_path=frozenset({OffPathFeature.SKIP_EXTEND}))
    names = _hook_names(undeclared, settings.SPECCTL)
    assert names & _EVERY_OFF_PATH_HOOK == {"skip_extend"}


def test_the_hooks_depend_on_the_adapter_and_the_off_path_alone(
    fresh_settings: pytest.MonkeyPatch, tmp_path: Path,
) -> None:
    """The plugin loaded through SGLANG_PLUGINS alone and the one `specctl serve` starts run
    the same hooks: serve's environment sets no plugin variable, and the hooks chosen under
    it are those chosen under an empty one; only SPECCTL_OFF_PATH changes them."""
    _, env, _ = launch.build_command(["--model-path", "m", "--speculative-algorithm", "EAGLE3"],
                                     tmp_path / "cfg.json", current_env={})
    assert not [k for k in env if k.startswith("SPECCTL_")]
    for adapter in ADAPTERS:
        bare = {spec.target for spec in plugin.wanted_hooks(adapter)}
        for key, value in env.items():
            fresh_settings.setenv(key, value)
        served = {spec.target for spec in plugin.wanted_hooks(adapter)}
        assert served == bare, adapter.name
        fresh_settings.setenv("SPECCTL_OFF_PATH", "sglang")
        assert {spec.target for spec in plugin.wanted_hooks(adapter)} < bare
        fresh_settings.delenv("SPECCTL_OFF_PATH")


def test_a_request_carries_a_table_or_a_release() -> None:
    table = PolicyTable.build([Tier(1, 3), Tier(8, 0, hysteresis=2)], 4)
    assert validate_change(encode_table(table), {0, 3}) == table
    assert validate_change(encode_table(None), {0, 3}) is None


@pytest.mark.parametrize("key", ["specctl_off_mode", "specctl_lean_host", "specctl_lean_relay",
                                 "specctl_fence_at_replay", "specctl_skip_draft_prefill",
                                 "specctl_plain_decode"])
def test_a_former_plugin_setting_is_refused_as_any_unknown_key(key: str) -> None:
    table = PolicyTable.build([Tier(1, 3), Tier(8, 0, hysteresis=2)], 4)
    with pytest.raises(PolicyError) as beside:
        validate_change({**encode_table(table), key: 1}, {0, 3})
    with pytest.raises(PolicyError) as other:
        validate_change({**encode_table(table), "specctl_no_such_key": 1}, {0, 3})
    assert beside.value.field == key and beside.value.message == other.value.message
    with pytest.raises(PolicyError) as alone:
        validate_change({key: 1}, {0, 3})
    assert alone.value.field == "specctl_version"  # as a lone unknown key is answered


def test_only_depth_zero_tiers_that_probe_no_positive_depth_skip() -> None:
    table = PolicyTable.build([
        Tier(1, 3, explore_share=0.1, explore_depths=(0,)),  # probes off: keeps the extend
        Tier(8, 0, hysteresis=2),  # off, no probes
        Tier(32, 0, hysteresis=4, explore_share=0.1, explore_depths=(2,)),  # off, probes d2
    ], 1)
    assert skippable_tiers(table) == (False, True, False)
    assert skippable_tiers(None) == ()


@pytest.mark.parametrize(("path", "features", "skips"), [
    (settings.SPECCTL, v0_5_23.ADAPTER.off_path, True),
    (settings.SPECCTL, v0_5_17.ADAPTER.off_path, True),
    (settings.SGLANG, frozenset(), False),
])  # fmt: skip
def test_the_depth_choice_says_which_launches_skip_the_extend(
    path: str, features: frozenset[OffPathFeature], skips: bool,
) -> None:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    rt.activate({0, 1, 3}, None)
    rt.commit(PolicyTable.build([Tier(1, 3), Tier(16, 0, hysteresis=2)], 2))
    rt.use_off_path(path, features)  # as steering starts; a table already there follows it
    assert rt.choose(4) == 3 and not rt.launch_skips_extend
    assert rt.choose(20) == 0 and rt.launch_skips_extend is skips
    rt.commit(PolicyTable.build([Tier(1, 0, hysteresis=0)], 3))
    assert rt.choose(20) == 0 and rt.launch_skips_extend is skips
    assert rt.prefill_skips_draft(4) is skips
    rt.commit(None)  # SGLang's own choice: never skipped by the plugin
    assert rt.choose(20) is None and not rt.launch_skips_extend
    assert not rt.prefill_skips_draft(4)


def test_the_report_says_what_depth_0_runs() -> None:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    before = rt.report()
    assert before["off_path"] == {"path": None, "features": []}  # not steering yet
    rt.use_off_path(settings.SPECCTL, v0_5_17.ADAPTER.off_path)
    report = rt.report()
    assert report["off_path"] == {"path": "specctl", "features": [
        "host-trims", "plain-decode", "skip-draft-prefill", "skip-extend"]}
    assert json.loads(json.dumps(report))["off_path"] == report["off_path"]
    assert (rt.host_trims, rt.plain_decode_path) == (True, True)
    assert report["host_trim_runs"] == dict.fromkeys(lean_host.PREPARE_TRIMS, 0)
    assert (report["skipped_draft_extends"], report["skipped_draft_prefills"],
            report["replay_fences"]) == (0, 0, 0)
    for gone in ("off_mode", "lean_host", "lean_relay", "fence_at_replay", "skip_draft_prefill",
                 "lean_prepare", "verify_schedule", "early_fences", "lean_stashes"):
        assert gone not in report
    assert not {"enabled", "env_error", "live"} & set(report["plain_decode"])
    rt.use_off_path(settings.SGLANG, ())
    assert rt.report()["off_path"] == {"path": "sglang", "features": []}
    assert (rt.host_trims, rt.plain_decode_path, rt.skips_extend) == (False, False, False)


# ----------------------------------------------------------------------------- counts


def test_a_result_with_no_row_left_is_not_counted() -> None:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    rt.activate({3}, None)
    rt.record_result(3, 0, 0, (False, None))
    rt.record_result(3, 2, 5, (False, None))
    assert rt.empty_results == 1
    assert list(rt.counters.pending) == [(3, 2)] and rt.counters.pending[(3, 2)][:3] == [1, 2, 5]


# ----------------------------------------------------------------------------- override log


def _overlay(log: list[Any]) -> dict[str, Any]:
    """How SGLang reads the log (RuntimeContext.resolved_server_args_dict)."""
    out: dict[str, Any] = {}
    for _source, fields in log:
        out.update(fields)
    return out


def test_dropping_superseded_switches_keeps_every_resolved_value() -> None:
    log: list[Any] = [("adaptive_spec.capture_override", {"speculative_num_steps": 3,
                                                          "cuda_graph_bs_decode": [1, 2]}),
                      ("scheduler.default", {"pp_max_micro_batch_size": 8})]
    full = list(log)
    for i in range(10_000):
        entry = ("adaptive_spec.restore", {"speculative_num_steps": i % 4,
                                           "speculative_num_draft_tokens": i % 4 + 1})
        log.append(entry)
        full.append(entry)
        override_log.drop_superseded(log)
        if i % 997 == 0:
            assert _overlay(log) == _overlay(full)
    assert len(log) == 3 and _overlay(log) == _overlay(full)
    # An entry that sets more keys than the switch is never dropped.
    log.insert(2, ("adaptive_spec.restore", {"speculative_num_steps": 9, "other": 1}))
    log.append(("adaptive_spec.restore", {"speculative_num_steps": 1,
                                          "speculative_num_draft_tokens": 2}))
    assert override_log.drop_superseded(log)
    assert ("adaptive_spec.restore", {"speculative_num_steps": 9, "other": 1}) in log
    assert not override_log.drop_superseded([("other", {"a": 1})])


# ----------------------------------------------------------------------------- deferred hooks


@pytest.fixture
def fake_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"specctl_fake_{tmp_path.name.replace('-', '_')}"
    pkg = tmp_path / name
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "target.py").write_text(textwrap.dedent("""
        class Worker:
            def step(self, n):
                return n + 1
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    for mod in [m for m in sys.modules if m.startswith(name)]:
        del sys.modules[mod]


def _patching_apply(calls: list[str]) -> Any:
    def apply(hooks: Any) -> None:
        for h in hooks:
            module, cls, method = h.target.rsplit(".", 2)
            klass = getattr(sys.modules[module], cls)
            original = getattr(klass, method)
            setattr(klass, method, lambda self, *a, _o=original, _h=h.hook: _h(_o, self, *a))
            calls.append(h.target)
    return apply


def test_hooks_wait_for_their_module_and_apply_when_it_is_imported(fake_package: str) -> None:
    calls: list[str] = []
    deferred = DeferredHooks(_patching_apply(calls))
    target = f"{fake_package}.target.Worker.step"
    deferred.add([PendingHook(target, lambda orig, self, n: orig(self, n) * 10, "AROUND")])
    try:
        assert f"{fake_package}.target" not in sys.modules  # registering imported nothing
        assert calls == [] and deferred.pending_modules == [f"{fake_package}.target"]
        module = importlib.import_module(f"{fake_package}.target")
        assert calls == [target] and deferred.applied == [f"{fake_package}.target"]
        assert module.Worker().step(1) == 20
        assert deferred not in sys.meta_path  # nothing left to wait for
        # A module that is already imported is hooked at once.
        deferred.add([PendingHook(target, lambda orig, self, n: orig(self, n) + 5, "AROUND")])
        assert module.Worker().step(1) == 25
    finally:
        if deferred in sys.meta_path:
            sys.meta_path.remove(deferred)


def test_a_failing_patch_never_breaks_the_import(fake_package: str,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    def broken(hooks: Any) -> None:
        raise RuntimeError("registry changed")

    deferred = DeferredHooks(broken)
    deferred.add([PendingHook(f"{fake_package}.target.Worker.step", lambda *a: None, "AROUND")])
    try:
        module = importlib.import_module(f"{fake_package}.target")
    finally:
        if deferred in sys.meta_path:
            sys.meta_path.remove(deferred)
    assert module.Worker().step(1) == 2  # unpatched, imported fine
    assert deferred.failed == [f"{fake_package}.target"]
    assert any("could not hook" in r.getMessage() for r in caplog.records)
