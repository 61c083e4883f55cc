"""`controller.yaml`: the daemon's configuration, validated with pydantic.

Every field has a default and a description; docs/daemon.md lists them all (a test checks that
the docs, the commented `controller.yaml` and this schema agree). A typo or a bad value is
reported by its path (`targets[0].urll: unknown field ...`, `targets[0]: url ...` for a check
on the whole target) with the fix, never as a traceback.
"""

from __future__ import annotations

import os
from importlib import resources
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

DEFAULT_CONFIG_RESOURCE = "default.yaml"
# The API key's environment variable when a target names none (the smoke test reads it too).
API_KEY_ENV = "SPECCTL_API_KEY"
# What the daemon leaves on a server when it stops (controller/daemon/handback.py).
OnExit = Literal["restore", "keep-table", "release"]

PosFloat = Annotated[float, Field(gt=0.0)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]


def url_problem(url: str) -> str | None:
    """Why `url` cannot be a server's base URL, or None (the CLI's URL options use it too)."""
    if url.startswith(("http://", "https://")):
        return None
    if "://" not in url:
        return f"{url!r} has no scheme: add http:// (e.g. http://{url})"
    return f"must start with http:// or https://, got {url!r}"


class ConfigError(ValueError):
    """The config file is missing or invalid; the message names the field and the file."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimulatedTarget(_Strict):
    """An in-process simulated SGLang server (sims.server.SimulatedServer)."""

    profile: str = Field(
        "kimi-k25-8x-rtxpro6000-pcie", description="Built-in profile name or profile YAML path"
    )
    scenario: str = Field("ramp", description="Built-in workload scenario name or YAML path")
    seed: int = Field(0, description="Seed of the simulator's random draws")


class TargetConfig(_Strict):
    name: str = Field(description="Label used in logs, the store and the daemon's metrics")
    url: str | None = Field(
        None, description="Base URL of the SGLang server, e.g. http://gpu-node-1:30000"
    )
    simulated: SimulatedTarget | None = Field(
        None, description="Run a simulated server in-process instead of scraping a URL"
    )
    group: str = Field(
        "default",
        description="Targets with the same group (same hardware + model) share one learner",
    )
    admin_key: str | None = Field(
        None, description="Admin API key for POST /set_internal_state (Bearer)"
    )
    admin_key_env: str | None = Field(
        None, description="Read the admin key from this environment variable instead"
    )
    api_key: str | None = Field(
        None,
        description="The server's --api-key, if set: sent as Bearer on /metrics and "
        "/server_info (and on pushes when no admin key is set); unset: $SPECCTL_API_KEY if set",
    )
    api_key_env: str | None = Field(
        None, description="Read the API key from this environment variable instead"
    )
    source: Literal["server", "prometheus"] = Field(
        "server",
        description="Where counters come from: the server's /metrics, or a Prometheus server",
    )
    prometheus_url: str | None = Field(
        None, description="Base URL of the Prometheus server when source is prometheus"
    )
    prometheus_selector: str = Field(
        "",
        description="Extra label matchers selecting this server in Prometheus, "
        'e.g. instance="a:30000"',
    )
    timeout_s: PosFloat = Field(3.0, description="HTTP timeout of every scrape, read and push")
    seed_bench: Path | None = Field(
        None,
        description="A `specctl bench` of this server (the folder its --out wrote, or its "
        "bench.json): when the store holds no sample of this target yet, every level the "
        "bench measured at a forced depth becomes one, so the daemon starts from the bench "
        "instead of from nothing; the samples age out like any other (schedule.history_s)",
    )

    @model_validator(mode="after")
    def _one_kind(self) -> TargetConfig:
        if (self.url is None) == (self.simulated is None):
            raise ValueError("set exactly one of 'url' (a real server) or 'simulated'")
        problem = None if self.url is None else url_problem(self.url)
        if problem is not None:
            raise ValueError(f"url {problem}")
        if self.source == "prometheus":
            if self.prometheus_url is None:
                raise ValueError("source is 'prometheus': set prometheus_url")
            if self.simulated is not None:
                raise ValueError("a simulated target is scraped in-process; use source: server")
        return self

    def _secret(self, value: str | None, env: str | None, field: str) -> str | None:
        if env:
            found = os.environ.get(env)
            if found is None:
                raise ConfigError(
                    f"target '{self.name}' {field}_env: environment variable {env} is not set; "
                    f"export it where the daemon starts, or set {field} instead"
                )
            return found
        return value

    def resolved_admin_key(self) -> str | None:
        """The Bearer key for pushes: the admin key, else the API key (SGLang's rule)."""
        admin = self._secret(self.admin_key, self.admin_key_env, "admin_key")
        return admin if admin is not None else self.resolved_api_key()

    def resolved_api_key(self) -> str | None:
        key = self._secret(self.api_key, self.api_key_env, "api_key")
        if key is None and self.simulated is None:
            # SGLang's --api-key guards every route but /metrics and /health: a daemon next to
            # such a server reads the same variable as the other commands.
            key = os.environ.get(API_KEY_ENV) or None
        return key


class ScheduleConfig(_Strict):
    clock: Literal["wall", "simulated"] = Field(
        "wall",
        description="wall: real time with a background scheduler; simulated: the loop drives "
        "in-process simulators on an accelerated clock",
    )
    speedup: PosFloat = Field(
        60.0, description="Simulated clock only: simulated seconds per wall second"
    )
    duration_s: PosFloat | None = Field(
        None, description="Stop after this many (clock) seconds; null runs until interrupted"
    )
    scrape_interval_s: PosFloat = Field(5.0, description="Seconds between scrapes of a target")
    fit_interval_s: PosFloat = Field(30.0, description="Seconds between learner fits per group")
    decide_interval_s: PosFloat = Field(
        30.0, description="Seconds between table decisions (and pushes) per target"
    )
    history_s: PosFloat = Field(
        3600.0, description="Samples older than this are not loaded into the learner"
    )
    backoff_max_s: PosFloat = Field(
        120.0, description="Longest pause between scrapes of a target that keeps failing"
    )


class GuardrailConfig(_Strict):
    max_boundary_move: Fraction = Field(
        0.5,
        description="A tier boundary moves at most this fraction of its live value per push",
    )
    min_dwell_s: Annotated[float, Field(ge=0.0)] = Field(
        60.0, description="Minimum seconds between two pushes to a target (rollbacks excepted)"
    )
    rollback_window_s: PosFloat = Field(
        60.0, description="Seconds of measurement before and after a push that are compared"
    )
    rollback_drop: Fraction = Field(
        0.10,
        description="Roll back when measured tok/s at matched batch buckets drops by more than "
        "this fraction after a push",
    )
    rollback_min_iterations: Annotated[int, Field(ge=1)] = Field(
        200, description="Iterations needed in a bucket, before and after, for it to be compared"
    )
    takeover_min_gain: Annotated[float, Field(ge=0.0)] = Field(
        0.02,
        description="Replace the server's own (non-specctl) choice only when the model predicts "
        "this much more tok/s than measured under it at the same batch buckets",
    )
    takeover_max_wait_s: Annotated[float, Field(ge=0.0)] = Field(
        0.0,
        description="Take over anyway after this long with a fitted model, so that depths the "
        "server never runs get probed (0: with the first fitted model; the first table keeps "
        "the server's measured choice except where the model predicts takeover_min_gain)",
    )
    push_min_gain: Annotated[float, Field(ge=0.0)] = Field(
        0.005,
        description="Push a learned table only when the model predicts at least this much more "
        "decode tok/s than the live table, over the recent or the current load (or when it "
        "adds probes the model needs at a loaded batch size)",
    )
    react_window_s: Annotated[float, Field(ge=0.0)] = Field(
        120.0,
        description="After the load or acceptance moves, refit and decide after every scrape "
        "for this long, without the dwell time (0: never react, scheduled decisions only)",
    )
    react_acceptance_z: PosFloat = Field(
        3.0,
        description="A depth's acceptance over one scrape interval this many standard errors "
        "from the model's starts a reaction (the learner's own change-point test, which cuts "
        "the old evidence, then runs after every scrape)",
    )
    novel_load_share: Fraction = Field(
        0.3,
        description="Share of one scrape interval's decode time in batch buckets the live table "
        "was not decided on that counts as a change of load",
    )
    refused_backoff_s: PosFloat = Field(
        300.0, description="After a refused push, wait this long before pushing to that target"
    )
    verify: bool = Field(True, description="Read /server_info after a push to confirm the table")


class MetricsConfig(_Strict):
    enabled: bool = Field(True, description="Serve the daemon's own /metrics")
    host: str = Field("127.0.0.1", description="Address the daemon's /metrics listens on")
    port: Annotated[int, Field(ge=0, le=65535)] = Field(
        9465, description="Port of the daemon's /metrics (0: any free port)"
    )


class StoreConfig(_Strict):
    path: str = Field(
        "~/.local/state/specctl/specctl.sqlite",
        description="SQLite file holding samples, counter snapshots, pushes and models",
    )

    def resolved_path(self) -> Path:
        return Path(os.path.expandvars(self.path)).expanduser()


class ControllerConfig(_Strict):
    targets: list[TargetConfig] = Field(
        min_length=1, description="The servers this daemon scrapes and controls"
    )
    schedule: ScheduleConfig = Field(default_factory=lambda: ScheduleConfig.model_validate({}))
    guardrails: GuardrailConfig = Field(default_factory=lambda: GuardrailConfig.model_validate({}))
    metrics: MetricsConfig = Field(default_factory=lambda: MetricsConfig.model_validate({}))
    store: StoreConfig = Field(default_factory=lambda: StoreConfig.model_validate({}))
    learner: dict[str, Any] = Field(
        default_factory=dict,
        description="Overrides of models.learner.LearnerConfig (e.g. exploration_cap: 0.03)",
    )
    frozen_policy: str | None = Field(
        None,
        description="Path of a frozen policy file: push it, keep it, never learn a new table",
    )
    # The safe default is `restore`: a table found on the server is the operator's last choice,
    # and a server found released goes back to SGLang's own choice; no probes either way
    # (controller/daemon/handback.py says why the others are not the default).
    on_exit: OnExit = Field(
        "restore",
        description="What the daemon leaves on every server it pushed to when it stops, "
        "never with probes: restore (the table found at start-up, or SGLang's own choice if "
        "none), keep-table (the found table, else the daemon's own table), release (SGLang's "
        "own choice)",
    )
    seed: int = Field(0, description="Seed of the learners' exploration draws")

    @model_validator(mode="after")
    def _consistent(self) -> ControllerConfig:
        names = [t.name for t in self.targets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"target names must be unique; repeated: {', '.join(dupes)}")
        simulated = [t.simulated is not None for t in self.targets]
        if self.schedule.clock == "simulated" and not all(simulated):
            raise ValueError(
                "schedule.clock 'simulated' needs every target to be 'simulated'; "
                "use clock: wall for real servers"
            )
        if self.schedule.clock == "wall" and any(simulated):
            raise ValueError(
                "in-process simulated targets run on schedule.clock 'simulated'; to run a "
                "simulator on real time, start `specctl sim serve` and give its url"
            )
        return self


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out or "(top level)"


def explain(err: ValidationError, root: tuple[Any, ...] = ()) -> str:
    """Every problem on one line, `targets[0].urll: <what is wrong>; ...`; `root` is where the
    validated value sits in the file (`("learner",)` for the learner's overrides)."""
    lines = []
    for e in err.errors():
        loc = _format_loc(root + tuple(e["loc"]))
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; docs/daemon-config.md lists every field)"
        lines.append(f"{loc}: {msg}")
    return "; ".join(lines)


def parse_config(data: Any, origin: str = "config") -> ControllerConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{origin}: must be a YAML mapping, got {type(data).__name__}")
    try:
        return ControllerConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin}: {explain(err)}") from None


def load_config(path: str | Path | None = None) -> ControllerConfig:
    """Load `path`, or the embedded default (an in-process simulated server) when None."""
    if path is None:
        text = resources.files("controller.daemon").joinpath(DEFAULT_CONFIG_RESOURCE).read_text()
        origin = "embedded default config"
    else:
        p = Path(path)
        if not p.exists():
            raise ConfigError(f"config file not found: {p}")
        text = p.read_text()
        origin = str(p)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ConfigError(f"{origin}: {yaml_problem(err)}") from None
    return parse_config(data, origin)


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML syntax error on one line, with its place in the file: PyYAML's own message
    spans several lines and names the parsed string ("<unicode string>"), not the file."""
    mark = getattr(err, "problem_mark", None)
    where = "" if mark is None else f"line {mark.line + 1}, column {mark.column + 1}: "
    problem = getattr(err, "problem", None) or " ".join(str(err).split())
    return f"{where}not valid YAML: {problem}"
