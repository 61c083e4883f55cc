"""Plugin parts added for the off mode, bounded logs, emitted-token counts and lazy hooking
that need no SGLang: they run in the main venv (the SGLang-side behaviour is tested with the
real classes in test_real_*.py).

Stand-ins: a throwaway package written to tmp_path stands in for an SGLang module in the
deferred-hook tests (what is under test is the import machinery, not SGLang).
"""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from sglang_hooks import lean_host, lean_relay, off_mode, override_log
from sglang_hooks.contract import PolicyError, PolicyTable, Tier, encode_table
from sglang_hooks.deferred import DeferredHooks, PendingHook
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.runtime import SchedulerRuntime, skippable_tiers, validate_change

# ----------------------------------------------------------------------------- off mode


def test_off_mode_wire_codes_and_env(monkeypatch: pytest.MonkeyPatch) -> None:
    assert [off_mode.decode_mode(i) for i in range(3)] == list(off_mode.MODES)
    assert off_mode.decode_mode(1.0) == off_mode.SKIP_EXTEND
    for bad in (3, -1, 0.5, True, "1"):
        with pytest.raises(PolicyError) as err:
            off_mode.decode_mode(bad)
        assert err.value.field == off_mode.OFF_MODE_KEY and "0 = sglang" in err.value.message
    monkeypatch.delenv(off_mode.OFF_MODE_ENV, raising=False)
    assert off_mode.mode_from_env() == (off_mode.DEFAULT_MODE, None)
    monkeypatch.setenv(off_mode.OFF_MODE_ENV, "sglang")
    assert off_mode.mode_from_env() == ("sglang", None)
    monkeypatch.setenv(off_mode.OFF_MODE_ENV, "lean")
    mode, error = off_mode.mode_from_env()
    assert mode == off_mode.DEFAULT_MODE and error is not None and "'lean'" in error


def test_a_request_may_carry_an_off_mode_a_table_or_both() -> None:
    table = PolicyTable.build([Tier(1, 3), Tier(8, 0, hysteresis=2)], 4)
    only_mode = validate_change({off_mode.OFF_MODE_KEY: 0}, {0, 3})
    assert only_mode.off_mode == "sglang" and not only_mode.table_given
    both = validate_change({**encode_table(table), off_mode.OFF_MODE_KEY: 2}, {0, 3})
    assert both.table == table and both.off_mode == "skip-extend-all"
    release = validate_change(encode_table(None), {0, 3})
    assert release.table_given and release.table is None and release.off_mode is None
    with pytest.raises(PolicyError, match=off_mode.OFF_MODE_KEY):
        validate_change({**encode_table(table), off_mode.OFF_MODE_KEY: 9}, {0, 3})


@pytest.mark.parametrize(("switch", "field", "other"), [
    (lean_host, "lean_host", lean_relay),
    (lean_relay, "lean_relay", lean_host),
])  # fmt: skip
def test_each_trims_key_is_decoded_alone_or_beside_the_rest(
    switch: Any, field: str, other: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Either on/off plugin setting: decoded alone or beside the other settings, refused by
    name, committed and reported, left as it was by requests without it, read from its
    environment variable at start-up."""
    assert getattr(validate_change({switch.KEY: 1}, {0, 3}), field) is True
    both = validate_change({switch.KEY: 0, off_mode.OFF_MODE_KEY: 0, other.KEY: 1}, {0, 3})
    assert getattr(both, field) is False and both.off_mode == "sglang" and not both.table_given
    assert getattr(validate_change({other.KEY: 1}, {0, 3}), field) is None
    for bad in (2, "1", -1, 0.5, None):
        with pytest.raises(PolicyError) as err:
            validate_change({switch.KEY: bad}, {0, 3})
        assert err.value.field == switch.KEY and "0 (SGLang's own" in err.value.message
    runtime = SchedulerRuntime(timer=HostIntervalTimer())
    runtime.commit(validate_change({switch.KEY: 1}, {0, 3}))
    report = runtime.report()
    assert getattr(runtime, field) and report[field] is True
    assert report["early_fences"] == 0 and report["lean_stashes"] == 0
    runtime.commit(validate_change({off_mode.OFF_MODE_KEY: 2, other.KEY: 0}, {0, 3}))
    assert getattr(runtime, field), "a request without the key leaves the trims as they were"
    monkeypatch.delenv(switch.ENV, raising=False)
    assert switch.from_env() == (False, None)
    monkeypatch.setenv(switch.ENV, "1")
    assert switch.from_env() == (True, None)
    monkeypatch.setenv(switch.ENV, "yes")
    on, error = switch.from_env()
    assert not on and error is not None and "'yes'" in error and switch.ENV in error


def test_only_depth_zero_tiers_skip_and_probing_ones_only_in_skip_extend_all() -> None:
    table = PolicyTable.build([
        Tier(1, 3, explore_share=0.1, explore_depths=(0,)),  # probes off: keeps the extend
        Tier(8, 0, hysteresis=2),  # off, no probes
        Tier(32, 0, hysteresis=4, explore_share=0.1, explore_depths=(2,)),  # off, probes d2
    ], 1)
    assert skippable_tiers(table, "sglang") == ()
    assert skippable_tiers(table, "skip-extend") == (False, True, False)
    assert skippable_tiers(table, "skip-extend-all") == (False, True, True)


def test_the_depth_choice_says_which_launches_skip_the_extend() -> None:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    rt.activate({0, 1, 3}, None)
    rt.commit(PolicyTable.build([Tier(1, 3), Tier(16, 0, hysteresis=2)], 2))
    assert rt.off_mode == off_mode.DEFAULT_MODE == "skip-extend"
    assert rt.choose(4) == 3 and not rt.launch_skips_extend
    assert rt.choose(20) == 0 and rt.launch_skips_extend
    rt.commit(validate_change({off_mode.OFF_MODE_KEY: 0}, {0, 1, 3}))  # mode only
    assert rt.table is not None and rt.table.version == 2  # the table stays
    assert rt.choose(20) == 0 and not rt.launch_skips_extend
    assert rt.report()["off_mode"] == "sglang"
    rt.commit(validate_change({off_mode.OFF_MODE_KEY: 1}, {0, 1, 3}))
    assert rt.choose(20) == 0 and rt.launch_skips_extend
    rt.commit(None)  # SGLang's own choice: never skipped by the plugin
    assert rt.choose(20) is None and not rt.launch_skips_extend


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
