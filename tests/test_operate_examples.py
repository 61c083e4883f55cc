"""The operator guide's examples (docs/operate/) are real: every metric the Grafana dashboard
plots is exported, and the systemd unit and the compose file run real `specctl` commands.

The dashboard's PromQL is parsed with promql-parser; the daemon's names are checked against a
running daemon's /metrics (a `Controller` scraping a simulated server over loopback HTTP, its
metrics served on a free port), the plugin's against a simulated server's /metrics and the
contract's list. Commands are parsed by the CLI's own click commands, options and all.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import promql_parser
import pytest
import yaml
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.parser import text_string_to_metric_families
from test_daemon_http import Loopback, controller_for, new_sim
from typer.main import get_command

from controller.cli import load_commands

try:  # typer vendors click since 0.2x (as controller/cli/__init__.py notes)
    from typer._click.core import Context
    from typer._click.exceptions import NoSuchOption
except ImportError:  # pragma: no cover
    from click import Context, NoSuchOption  # type: ignore[assignment]
from controller.daemon.config import load_config
from sglang_hooks.contract import (
    COUNTER_FAMILIES,
    METRIC_CAPTURED_DEPTH,
    METRIC_POLICY_VERSION,
    SGLANG_GAUGES,
)
from sims.http import create_app

ROOT = Path(__file__).resolve().parents[1]
OPERATE = ROOT / "docs" / "operate"
# Labels Prometheus adds to every series it scrapes.
TARGET_LABELS = {"instance", "job"}


# ----------------------------------------------------------------------------- PromQL


def _children(node: Any) -> Iterator[Any]:
    for attr in ("lhs", "rhs", "expr", "param", "vector_selector"):
        child = getattr(node, attr, None)
        if child is not None and not isinstance(child, (str, int, float)):
            yield child
    yield from getattr(node, "args", None) or ()


def _selectors(node: Any) -> Iterator[Any]:
    if type(node).__name__ == "VectorSelector":
        yield node
    for child in _children(node):
        yield from _selectors(child)


def _label_uses(node: Any) -> Iterator[tuple[set[str], set[str]]]:
    """(metric names, label names they must carry) for every matcher and `by (...)`."""
    kind = type(node).__name__
    if kind == "VectorSelector":
        yield {node.name}, {m.name for m in node.matchers.matchers if m.name != "__name__"}
    by = promql_parser.AggModifierType.By  # `by (...)`, not `without (...)`
    if kind == "AggregateExpr" and node.modifier is not None and node.modifier.type == by:
        yield {vs.name for vs in _selectors(node.expr)}, set(node.modifier.labels)
    for child in _children(node):
        yield from _label_uses(child)


def _dashboard_queries() -> list[tuple[str, Any]]:
    dash = json.loads((OPERATE / "grafana-dashboard.json").read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            out.append((f"{panel['title']}: {target['expr']}", promql_parser.parse(target["expr"])))
    return out


# ----------------------------------------------------------------------------- exported names


def _families(text: str) -> dict[str, set[str]]:
    """{series name as queried: label names seen} from Prometheus text."""
    out: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = out.setdefault(name, set())
        for sample in family.samples:
            labels.update(sample.labels)
    return out


@pytest.fixture(scope="module")
def exported() -> dict[str, set[str]]:
    """What a running daemon and the simulated server it scrapes export."""
    sim = new_sim(concurrency=16)
    lb = Loopback(create_app(sim)).start()
    tmp = Path(tempfile.mkdtemp())
    try:
        ctl, _store = controller_for(tmp, [{"name": "a", "url": lb.url}])
        port = ctl.metrics.serve("127.0.0.1", 0)
        now = 0.0
        for _ in range(4):
            sim.advance(5.0)
            now += 5.0
            ctl.scrape("a", now)
            ctl.fit("default", now)
            ctl.decide("a", now)
        daemon = _families(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)
        server = _families(httpx.get(f"{lb.url}/metrics", timeout=5).text)
        # Label names of the daemon's metrics, those without a series yet included.
        for metric in vars(ctl.metrics).values():
            if isinstance(metric, MetricWrapperBase):
                name = metric._name + ("_total" if metric._type == "counter" else "")
                daemon.setdefault(name, set()).update(metric._labelnames)
        ctl.close()
    finally:
        lb.stop()
    contract = {f + "_total" for f in COUNTER_FAMILIES}
    contract |= {METRIC_POLICY_VERSION, METRIC_CAPTURED_DEPTH, *SGLANG_GAUGES}
    # The plugin's and SGLang's names: in the contract's list and on a server's /metrics.
    plugin = {name: labels for name, labels in server.items() if name in contract}
    return {**plugin, **{n: ls for n, ls in daemon.items() if n.startswith("specctl_daemon_")}}


def test_every_metric_the_dashboard_plots_is_exported(exported) -> None:
    queries = _dashboard_queries()
    assert len(queries) >= 10
    used = set()
    for where, ast in queries:
        for vs in _selectors(ast):
            used.add(vs.name)
            assert vs.name in exported, f"{where}: {vs.name} is not exported"
        for names, labels in _label_uses(ast):
            for name in names:
                missing = labels - exported.get(name, set()) - TARGET_LABELS
                assert not missing, f"{where}: {name} has no label {sorted(missing)}"
    # The panels the guide promises: tok/s per depth, live table, pushes, probes, scrape errors.
    for name in (
        "specctl_decode_tokens_total",
        "specctl_daemon_live_tiers",
        "specctl_daemon_push_reasons_total",
        "specctl_daemon_probe_share",
        "specctl_daemon_scrape_errors_total",
    ):
        assert name in used


def test_the_guide_names_only_exported_metrics(exported) -> None:
    guide = (ROOT / "docs" / "operate.md").read_text()
    named = set(re.findall(r"\b(specctl_daemon_[a-z_]+|specctl_[a-z_]+_total)\b", guide))
    assert named, "docs/operate.md names no metric"
    assert named <= exported.keys(), sorted(named - exported.keys())


# ----------------------------------------------------------------------------- commands


def _parse_specctl(argv: list[str]) -> Context:
    """Parse `specctl ARGV` as the console script would, without running the command."""
    assert Path(argv[0]).name == "specctl", argv
    root: Any = get_command(load_commands())
    name, rest = argv[1], argv[2:]
    command = root.get_command(Context(root), name)
    assert command is not None, f"specctl has no command {name!r}"
    return command.make_context(name, rest)


def test_the_systemd_unit_runs_the_daemon_with_the_shipped_config() -> None:
    unit = configparser.ConfigParser(strict=False, interpolation=None)
    unit.optionxform = str  # type: ignore[assignment,method-assign]  # keys are case-sensitive
    unit.read(OPERATE / "specctl-daemon.service")
    assert {"Unit", "Service", "Install"} <= set(unit.sections())
    service = unit["Service"]
    ctx = _parse_specctl(shlex.split(service["ExecStart"]))
    assert ctx.info_name == "daemon"
    config = Path(ctx.params["config"])
    assert (OPERATE / config.name).is_file()
    assert service["KillSignal"] in ("SIGTERM", "SIGINT")  # both hand the server back
    assert service["StateDirectory"] == "specctl"
    cfg = load_config(OPERATE / config.name)
    assert str(cfg.store.resolved_path()).startswith("/var/lib/specctl/")


def test_the_compose_sidecar_shares_sglangs_network_and_reads_the_key_from_the_env() -> None:
    compose = yaml.safe_load((OPERATE / "sidecar-compose.yaml").read_text())
    sglang, daemon = compose["services"]["sglang"], compose["services"]["specctl-daemon"]
    ctx = _parse_specctl(daemon["command"])
    assert ctx.info_name == "daemon"
    assert daemon["network_mode"] == "service:sglang"
    assert daemon["stop_signal"] == "SIGTERM"
    mounted = {v.split(":")[1]: v.split(":")[0] for v in daemon["volumes"]}
    config = mounted[str(ctx.params["config"])]
    cfg = load_config(OPERATE / config)
    key_env = cfg.targets[0].admin_key_env
    assert key_env is not None and daemon["environment"][key_env].startswith(f"${{{key_env}")
    assert cfg.targets[0].url == "http://127.0.0.1:30000"  # the shared namespace
    serve = _parse_specctl(sglang["command"])
    assert serve.info_name == "serve"
    sglang_args = sglang["command"][sglang["command"].index("--") + 1 :]
    assert sglang_args[sglang_args.index("--admin-api-key") + 1].startswith(f"${{{key_env}")
    assert sglang_args[sglang_args.index("--port") + 1] == "30000"


def test_a_typo_in_a_command_is_caught_by_the_parser() -> None:
    with pytest.raises(NoSuchOption):
        _parse_specctl(["specctl", "daemon", "--confg", "x.yaml"])


# ----------------------------------------------------------------------------- freeze flow


def test_the_simulated_server_starts_with_a_policy_file_as_the_plugin_does(tmp_path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("table:\n  version: 3\n  tiers:\n    - {min_batch: 1, depth: 2}\n"
                      "    - {min_batch: 32, depth: 0, hysteresis: 4}\n")  # fmt: skip
    served = subprocess.Popen(
        [sys.executable, "-m", "controller.cli", "sim", "serve", "--port", "0",
         "--profile", "kimi-k25-8x-rtxpro6000-pcie"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "SPECCTL_POLICY_FILE": str(policy)},
    )  # fmt: skip
    try:
        assert served.stdout is not None
        line = served.stdout.readline()
        url = re.search(r"on (http://127\.0\.0\.1:\d+),", line)
        assert url is not None, line
        assert "start-up table v3" in line
        info = httpx.get(f"{url.group(1)}/server_info", timeout=10).json()
        state = info["internal_states"][0]["specctl"]
        assert state["source"] == "startup" and state["table"]["version"] == 3
    finally:
        served.terminate()
        served.wait(timeout=20)
    bad = tmp_path / "bad.yaml"
    bad.write_text("table:\n  version: 1\n  tiers:\n    - {min_batch: 1, depth: 9}\n")
    refused = subprocess.run(
        [sys.executable, "-m", "controller.cli", "sim", "serve", "--port", "0",
         "--profile", "kimi-k25-8x-rtxpro6000-pcie", "--policy-file", str(bad)],
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and "--policy-file" in refused.stderr
