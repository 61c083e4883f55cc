"""Read a `specctl bench` result (bench.json) for the fit: levels, protocol and server facts.

Times are converted to the server's own clock: a bench of `specctl sim serve --speedup X` timed
wall seconds, X simulated seconds each (the server says X in `/server_info`, recorded under
`servers.*.simulated.speedup`); a real server has no such key and a factor of 1.

Every problem is a `BenchFileError` whose message names the file and the field.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_hooks.contract import (
    OFF_PATH_KEY,
    OFF_PATH_SGLANG,
    OFF_PATH_SPECCTL,
    OFF_PATHS,
    OffPathFeature,
)

# What `specctl bench` writes (controller/bench/report.py and sweep.py define the writer's
# side; tests/test_sim_fit.py checks that the two agree). Spelled here so that the simulator
# does not import the bench, which sits above it.
BENCH_FORMAT = "specctl-bench/2"
NO_SPEC = "no-spec"


class BenchFileError(ValueError):
    """A bench file is missing or malformed; the message names the file and the field."""


@dataclass(frozen=True)
class ServerFacts:
    cap: int  # running requests at once
    max_total_tokens: int | None
    max_prefill_tokens: int | None
    context_length: int | None
    speedup: float  # server seconds per wall second (1 for a real server)
    captured_depths: tuple[int, ...]
    full_depth: int | None  # speculative_num_steps
    model: str | None
    version: str | None
    off_path: str | None = None  # the plugin's depth-0 path, if the bench recorded it
    # whether the plugin skipped the draft's prefill for admissions at depth 0, if recorded
    skip_draft_prefill: bool | None = None
    # whether depth 0 ran as a plain decode (the plugin's DECODE runners live), if recorded
    plain_decode: bool | None = None
    recv_interval: int | None = None  # --scheduler-recv-interval, if the bench recorded it


@dataclass(frozen=True)
class Level:
    """One measured (series, concurrency) point, on the server's clock."""

    source: str  # the bench file
    series: str
    depth: int | None  # None: the server without speculation
    concurrency: int
    requests: int
    errors: int
    elapsed_s: float
    tok_per_s: float
    ttft_p50_ms: float | None
    tpot_p50_ms: float | None
    step_ms: float | None  # mean decode step from the server's counters
    mean_batch: float | None
    accept_length: float | None
    prompt_tokens: float | None
    output_tokens: float | None
    foreign_traffic: bool
    # As the server timed them (its latency histograms): mean TTFT, mean inter-token latency.
    server_ttft_ms: float | None = None
    server_itl_ms: float | None = None
    # Unmeasured load before the window (server seconds); 0 in benches from before warm-ups.
    warmup_s: float = 0.0
    request_rate: float | None = None  # an open-loop level's arrivals per second
    # Shortest and longest output among the window's requests (None in older benches).
    output_tokens_min: int | None = None
    output_tokens_max: int | None = None
    # Bench files whose alike levels this one stands for, as their mean (sims.fit.repeats).
    benches: int = 1
    # Prefill batches per decode iteration in the window (SGLang's pass counter; None in older
    # benches): how often arriving requests' prefills ran between the iterations.
    prefills_per_decode: float | None = None

    @property
    def label(self) -> str:
        return f"{self.series} c={self.concurrency}"

    def unfit_reason(self) -> str | None:
        """Why this level cannot be fitted or scored, or None if it can."""
        if self.request_rate is not None:
            return "an open-loop level (--request-rate); the fit replays closed loops only"
        if self.foreign_traffic:
            return "flagged foreign traffic (the server ran bigger batches than this level sent)"
        if self.requests == 0:
            return "no finished request"
        if self.errors:
            return f"{self.errors} failed request(s)"
        if self.tpot_p50_ms is None:
            return "no TPOT (no finished request produced two tokens or more)"
        if self.prompt_tokens is None or self.output_tokens is None:
            return "no request shape (the server reported no usage)"
        return None


@dataclass(frozen=True)
class BenchRun:
    path: str
    levels: tuple[Level, ...]
    spec: ServerFacts
    no_spec: ServerFacts | None
    request_limit: int | None  # --requests-per-level
    duration_s: float | None  # --duration-per-level (wall)
    # The bench's prompts came round within a server's KV pool (bench.json
    # `prompts_came_round`): repeats could hit its prefix cache whole, which the model lacks.
    prompts_came_round: bool = False


def _err(path: Path, where: str, what: str) -> BenchFileError:
    return BenchFileError(f"{path}: {where}: {what}")


def _number(path: Path, where: str, value: Any, *, optional: bool, low: float | None = None) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        kind = "a number or null" if optional else "a number"
        raise _err(path, where, f"must be {kind}, got {value!r}")
    if low is not None and value < low:
        raise _err(path, where, f"must be >= {low:g}, got {value!r}")
    return float(value)


def _int(path: Path, where: str, value: Any, *, optional: bool = False, low: int = 0) -> Any:
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        kind = "an integer" + (" or null" if optional else "")
        raise _err(path, where, f"must be {kind} >= {low}, got {value!r}")
    return value


def read_facts(path: Path, where: str, raw: Any) -> ServerFacts:
    """A server's /server_info facts as a bench recorded them at `where` in `path`."""
    if not isinstance(raw, dict):
        raise _err(path, where, f"must be an object (the server's /server_info facts), got {raw!r}")
    cap = raw.get("effective_max_running_requests_per_dp")
    if cap is None:
        cap = raw.get("max_running_requests")
    cap = _int(path, f"{where}.max_running_requests", cap, low=1)
    simulated = raw.get("simulated")
    speedup = 1.0
    if isinstance(simulated, dict) and simulated.get("speedup") is not None:
        speedup = _number(
            path, f"{where}.simulated.speedup", simulated["speedup"], optional=False, low=1e-9
        )
    depths = raw.get("captured_depths") or []
    if not isinstance(depths, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in depths
    ):
        raise _err(path, f"{where}.captured_depths", f"must be a list of depths, got {depths!r}")

    def count(key: str, low: int = 1) -> int | None:  # an optional /server_info integer
        return _int(path, f"{where}.{key}", raw.get(key), optional=True, low=low)

    def text(key: str) -> str | None:
        return raw.get(key) if isinstance(raw.get(key), str) else None

    off_path, skip_prefill = _off_path(path, where, raw)

    return ServerFacts(
        cap=cap,
        max_total_tokens=count("max_total_num_tokens"),
        max_prefill_tokens=count("max_prefill_tokens"),
        context_length=count("context_length"),
        speedup=speedup,
        captured_depths=tuple(sorted(set(depths))),
        full_depth=count("speculative_num_steps", low=0),
        model=text("model_path"),
        version=text("version"),
        off_path=off_path,
        skip_draft_prefill=skip_prefill,
        plain_decode=None if (runners := count("plain_decode_runners", low=0)) is None
        else runners > 0,
        recv_interval=count("scheduler_recv_interval"),
    )


# The plugin's depth-0 modes before it had one path (older benches recorded `off_mode` and
# `skip_draft_prefill`), as the path they ran: SGLang's own depth 0, or the plugin's.
_OLD_OFF_MODES = {"sglang": OFF_PATH_SGLANG, "skip-extend": OFF_PATH_SPECCTL,
                  "skip-extend-all": OFF_PATH_SPECCTL}


def _off_path(path: Path, where: str, raw: dict[str, Any]) -> tuple[str | None, bool | None]:
    """(the plugin's depth-0 path, whether admissions at depth 0 skipped the draft's prefill),
    each None where the bench did not record it: from `off_path` (path and pieces), else from
    an older bench's `off_mode` and `skip_draft_prefill`."""
    reported = raw.get(OFF_PATH_KEY)
    if reported is not None:
        ran = reported.get("path") if isinstance(reported, dict) else None
        features = reported.get("features") if isinstance(reported, dict) else None
        if ran not in OFF_PATHS or not isinstance(features, list):
            raise _err(path, f"{where}.{OFF_PATH_KEY}", f'must be {{"path": one of '
                       f'{", ".join(OFF_PATHS)}, "features": [...]}}, got {reported!r}')
        return ran, OffPathFeature.SKIP_DRAFT_PREFILL in features
    mode, skip = raw.get("off_mode"), raw.get("skip_draft_prefill")
    if mode is not None and mode not in _OLD_OFF_MODES:
        raise _err(path, f"{where}.off_mode", f"must be one of {', '.join(_OLD_OFF_MODES)} "
                   f"(the plugin's former depth-0 modes), got {mode!r}")
    return (None if mode is None else _OLD_OFF_MODES[mode]), \
        (skip if isinstance(skip, bool) else None)


def read_level(path: Path, i: int, raw: Any, spec: ServerFacts, no_spec: ServerFacts | None,
               list_name: str = "results") -> Level:
    """Level `i` of `list_name` in `path`, as `specctl bench` writes a level."""
    where = f"{list_name}[{i}]"
    if not isinstance(raw, dict):
        raise _err(path, where, f"must be an object, got {raw!r}")
    series = raw.get("series")
    if not isinstance(series, str):
        raise _err(path, f"{where}.series", f"must be a string, got {series!r}")
    depth = _int(path, f"{where}.depth", raw.get("depth"), optional=True)
    if (depth is None) != (series == NO_SPEC):
        raise _err(path, f"{where}.depth", f"{depth!r} does not match series {series!r}")
    facts = spec if depth is not None else no_spec
    if facts is None:
        raise _err(path, "servers.no_spec", f"missing, but {where} is a {NO_SPEC!r} level")
    x = facts.speedup

    def num(key: str, optional: bool = True, low: float | None = 0.0) -> Any:
        return _number(path, f"{where}.{key}", raw.get(key), optional=optional, low=low)

    def scaled(key: str, factor: float) -> float | None:
        value = num(key)
        return None if value is None else value * factor

    foreign = raw.get("foreign_traffic", False)
    if not isinstance(foreign, bool):
        raise _err(path, f"{where}.foreign_traffic", f"must be true or false, got {foreign!r}")
    tok = num("output_tok_per_s", optional=False)
    shortest, longest = (
        _int(path, f"{where}.{key}", raw.get(key), optional=True, low=1)
        for key in ("output_tokens_min", "output_tokens_max")
    )
    if shortest is not None and longest is not None and shortest > longest:
        why = f"{shortest} is above output_tokens_max ({longest})"
        raise _err(path, f"{where}.output_tokens_min", why)
    return Level(
        source=str(path),
        series=series,
        depth=depth,
        concurrency=_int(path, f"{where}.concurrency", raw.get("concurrency"), low=1),
        requests=_int(path, f"{where}.requests", raw.get("requests")),
        errors=_int(path, f"{where}.errors", raw.get("errors")),
        elapsed_s=num("elapsed_s", optional=False) * x,
        tok_per_s=tok / x,
        ttft_p50_ms=scaled("ttft_p50_ms", x),
        tpot_p50_ms=scaled("tpot_p50_ms", x),
        step_ms=num("step_ms"),  # the server's counters already run on its own clock
        mean_batch=num("mean_batch"),
        accept_length=num("accept_length"),
        prompt_tokens=num("prompt_tokens", low=1.0),
        output_tokens=num("output_tokens", low=1.0),
        foreign_traffic=foreign,
        server_ttft_ms=num("server_ttft_ms"),  # on the server's clock already
        server_itl_ms=num("server_itl_ms"),
        warmup_s=(num("warmup_s") or 0.0) * x,
        request_rate=scaled("request_rate", 1.0 / x),
        output_tokens_min=shortest,
        output_tokens_max=longest,
        prefills_per_decode=_per_decode(path, where, raw),
    )


def _per_decode(path: Path, where: str, raw: dict[str, Any]) -> float | None:
    prefills, decodes = (
        _int(path, f"{where}.{key}", raw.get(key), optional=True)
        for key in ("prefill_passes", "decode_passes")
    )
    return None if prefills is None or not decodes else prefills / decodes


def load_bench(path: Path) -> BenchRun:
    """A bench.json written by `specctl bench` (format specctl-bench/2)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise BenchFileError(
            f"{path}: no such file (give the bench.json `specctl bench` wrote)"
        ) from None
    except OSError as err:
        raise BenchFileError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise BenchFileError(f"{path}: not JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise _err(path, "(top level)", "must be an object (a bench.json from specctl bench)")
    fmt = data.get("format")
    if fmt != BENCH_FORMAT:
        got = "no 'format'" if fmt is None else f"format {fmt!r}"
        raise _err(
            path,
            "format",
            f"{got}, the fit needs {BENCH_FORMAT!r} (server facts, "
            "per-level step and request shape): rerun `specctl bench` with this version",
        )
    servers = data.get("servers")
    if not isinstance(servers, dict):
        raise _err(path, "servers", f"must be an object, got {servers!r}")
    if "spec" not in servers:
        raise _err(path, "servers.spec", "missing (the speculative server's /server_info facts)")
    spec = read_facts(path, "servers.spec", servers["spec"])
    no_spec = (
        read_facts(path, "servers.no_spec", servers["no_spec"]) if servers.get("no_spec") else None
    )
    rule = data.get("stop_rule")
    if not isinstance(rule, dict):
        raise _err(path, "stop_rule", f"must be an object, got {rule!r}")
    limit = _int(path, "stop_rule.requests", rule.get("requests"), optional=True, low=1)
    duration = _number(path, "stop_rule.duration_s", rule.get("duration_s"), optional=True, low=0)
    if (limit is None) == (duration is None):
        raise _err(path, "stop_rule", "give exactly one of requests and duration_s")
    results = data.get("results")
    if not isinstance(results, list) or not results:
        raise _err(path, "results", "must be a non-empty list of levels")
    levels = tuple(read_level(path, i, raw, spec, no_spec) for i, raw in enumerate(results))
    return BenchRun(str(path), levels, spec, no_spec, limit, duration,
                    prompts_came_round=data.get("prompts_came_round") is True)
