"""GPU smoke test for the SGLang plugin: run it against a server started with `specctl serve`.

    python -m sglang_hooks.smoke --url http://127.0.0.1:30000 [--admin-key KEY] [--api-key KEY]

It checks, on a real server: the plugin is loaded and active (/server_info), every rank runs
depth 0 on the same path with the same pieces (`off_path`), a pushed table is applied
([true]) and reported, a malformed and an uncaptured-depth table get HTTP 400, and, while a
few concurrent requests decode, each forced depth makes its own per-depth counter move on
/metrics and, at depth 0 where the off path skips the draft extend, the skipped draft extends
grow. After each push it waits for the last iterations at the old depth to be exported, and
tolerates one straggler per replica on other depths, saying so. At the end it puts back the
table that was live before (a start-up policy table, a daemon's push, or none). It needs a
GPU server; it has not been run in specctl's CI, which has no GPU (see docs/sglang.md).
`--api-key` (or $SPECCTL_API_KEY) goes on /generate and /server_info, `--admin-key` (or
$SPECCTL_ADMIN_KEY) on pushes.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sglang_hooks.contract import (
    METRIC_ITERATIONS,
    OFF_PATH_KEY,
    OffPathFeature,
    PolicyTable,
    Tier,
    parse_table,
    push_body,
    read_server_state,
    single_depth_table,
)
from sglang_hooks.runtime import EXPORT_INTERVAL_S

ADMIN_KEY_ENV = "SPECCTL_ADMIN_KEY"  # the same variable `specctl bench` and `status` read
API_KEY_ENV = "SPECCTL_API_KEY"
# After a push, the batch launched before it is still processed at the old depth (overlap
# scheduling), and counts reach /metrics up to EXPORT_INTERVAL_S later: wait that out twice.
SETTLE_S = 2 * EXPORT_INTERVAL_S + 0.5
_BACKOFF_MAX_S = 5.0


def _bearer(key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"} if key else {}


def auth_headers(api_key: str | None, admin_key: str | None) -> tuple[dict[str, str],
                                                                      dict[str, str]]:
    """(headers for admin routes, headers for ordinary routes), as SGLang checks them.

    /set_internal_state takes the admin key when the server has one, else the API key;
    /generate and /server_info take only the API key (the admin key is refused there when
    both are set). /metrics needs no key.
    """
    return _bearer(admin_key or api_key), _bearer(api_key)


def _iterations_by_depth(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == METRIC_ITERATIONS:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["depth"]] = out.get(s.labels["depth"], 0.0) + s.value
    return out


class LoadErrors:
    """The last failure of the load threads, shown when a depth check fails."""

    def __init__(self) -> None:
        self.count = 0
        self.last: str | None = None

    def add(self, err: httpx.HTTPError) -> None:
        self.count += 1
        if isinstance(err, httpx.HTTPStatusError):
            self.last = f"HTTP {err.response.status_code} from /generate"
            if err.response.status_code in (401, 403):
                self.last += " (does the server have --api-key? pass --api-key or $" \
                             f"{API_KEY_ENV})"
        else:
            self.last = f"{type(err).__name__}: {err}"


def _load(client: httpx.Client, stop: threading.Event, errors: LoadErrors,
          wait: Any = None) -> None:
    """Keep one /generate in flight until `stop`; failures back off (0.5 s doubling to 5 s)."""
    wait = stop.wait if wait is None else wait
    body = {"text": "Count slowly from one to two hundred:", "sampling_params":
            {"max_new_tokens": 256, "temperature": 0}}
    backoff = 0.5
    while not stop.is_set():
        try:
            client.post("/generate", json=body, timeout=120).raise_for_status()
            backoff = 0.5
        except httpx.HTTPError as err:
            errors.add(err)
            wait(backoff)
            backoff = min(2 * backoff, _BACKOFF_MAX_S)


def depth_check(depth: int, before: dict[str, float], after: dict[str, float],
                stragglers: int) -> tuple[bool, str]:
    """Did only `depth` run between the two scrapes? Other depths may show up to `stragglers`
    iterations (one per replica: a batch launched before the push, processed after it)."""
    moved = {d: after.get(d, 0) - before.get(d, 0) for d in after}
    others = {d: v for d, v in moved.items() if d != str(depth) and v}
    ok = moved.get(str(depth), 0) > 0 and all(v <= stragglers for v in others.values())
    what = f"only depth {depth} counters moved: {moved}"
    if ok and others:
        what += (f" (tolerated: {sum(others.values()):g} iteration(s) on other depths, at most "
                 f"{stragglers} per depth: batches launched before the push)")
    return ok, what


def off_path_check(states: Sequence[Mapping[str, Any]]) -> tuple[bool, str]:
    """Every rank reports the same depth-0 path and pieces (`off_path` in /server_info)."""
    paths = [s.get(OFF_PATH_KEY) for s in states]
    ok = isinstance(paths[0], Mapping) and paths[0].get("path") is not None \
        and all(p == paths[0] for p in paths)
    return ok, f"every rank runs depth 0 on the same path: {paths}"


def skips_extend(state: Mapping[str, Any]) -> bool:
    """Whether this rank's off path skips the draft extend at depth 0."""
    path = state.get(OFF_PATH_KEY)
    return isinstance(path, Mapping) and OffPathFeature.SKIP_EXTEND in (path.get("features") or ())


def _skipped_extends(api: httpx.Client) -> int:
    return sum(int(s.get("skipped_draft_extends") or 0)
               for s in read_server_state(api.get("/server_info").json()))


def _check(ok: bool, what: str) -> bool:
    print(("PASS " if ok else "FAIL ") + what)
    return ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:30000",
                    help="the server started with `specctl serve` (default: %(default)s)")
    ap.add_argument("--admin-key", default=os.environ.get(ADMIN_KEY_ENV) or None,
                    help=f"the server's --admin-api-key, sent as a Bearer token "
                    f"(default: ${ADMIN_KEY_ENV})")
    ap.add_argument("--api-key", default=os.environ.get(API_KEY_ENV) or None,
                    help=f"the server's --api-key, sent on /generate and /server_info (and on "
                    f"pushes when there is no admin key) (default: ${API_KEY_ENV})")
    ap.add_argument("--concurrency", type=int, default=4,
                    help="generate requests kept in flight while depths are forced "
                    "(default: %(default)s)")
    ap.add_argument("--seconds-per-depth", type=float, default=15.0,
                    help="how long each forced depth runs before its counters are compared "
                    "(default: %(default)s)")
    args = ap.parse_args(argv)
    admin_headers, api_headers = auth_headers(args.api_key, args.admin_key)
    client = httpx.Client(base_url=args.url, headers=admin_headers, timeout=30)
    api = httpx.Client(base_url=args.url, headers=api_headers, timeout=30)
    results = []

    info = api.get("/server_info")
    if info.status_code in (401, 403):
        print(f"FAIL /server_info answered {info.status_code}: pass the server's --api-key "
              f"(--api-key or ${API_KEY_ENV})")
        return 1
    [state] = read_server_state(info.json())[:1]
    captured = state["captured_depths"]
    # Put back whatever was live (a start-up policy table, a daemon's push) at the end.
    previous = None if state.get("table") is None else parse_table(state["table"])
    results.append(_check(state.get("active", True) and len(captured) >= 2,
                          f"plugin active, captured depths {captured}"))

    bad = push_body(PolicyTable.build([Tier(1, captured[0]), Tier(8, captured[-1])], 1))
    bad["server_args"]["specctl_t1_hysteresis"] = 50
    r = client.post("/set_internal_state", json=bad)
    results.append(_check(r.status_code == 400 and "specctl_t1_hysteresis" in r.text,
                          f"malformed table refused with 400 ({r.status_code})"))
    results.append(_check(*off_path_check(read_server_state(info.json()))))
    uncaptured = next(d for d in range(16) if d not in captured)
    r = client.post("/set_internal_state",
                    json=push_body(single_depth_table(uncaptured, version=2)))
    results.append(_check(r.status_code == 400 and "not captured" in r.text,
                          f"uncaptured depth {uncaptured} refused with 400 ({r.status_code})"))

    stop = threading.Event()
    load_errors = LoadErrors()
    workers = [threading.Thread(target=_load, daemon=True, args=(
        httpx.Client(base_url=args.url, headers=api_headers), stop, load_errors))
        for _ in range(args.concurrency)]
    for w in workers:
        w.start()
    try:
        for version, depth in enumerate((captured[0], captured[-1]), start=10):
            r = client.post("/set_internal_state",
                            json=push_body(single_depth_table(depth, version=version)))
            results.append(_check(r.status_code == 200 and all(r.json()),
                                  f"push of depth {depth} applied: {r.text}"))
            live = read_server_state(api.get("/server_info").json())
            results.append(_check(all(s["version"] == version for s in live),
                                  f"/server_info shows version {version} on every rank"))
            time.sleep(SETTLE_S)  # let the old depth's last iterations reach /metrics
            before = _iterations_by_depth(api)
            skipped_before = _skipped_extends(api)
            time.sleep(args.seconds_per_depth)
            after = _iterations_by_depth(api)
            ok, what = depth_check(depth, before, after, stragglers=len(live))
            if not ok and load_errors.last is not None:
                what += f"; load requests failed {load_errors.count} times, last: " \
                        f"{load_errors.last}"
            results.append(_check(ok, what))
            if depth == 0 and skips_extend(live[0]):
                grew = _skipped_extends(api) - skipped_before
                results.append(_check(grew > 0, f"depth 0 on the {live[0][OFF_PATH_KEY]} path: "
                                      f"{grew} draft extends skipped"))
    finally:
        stop.set()
        r = client.post("/set_internal_state", json=push_body(previous))
        was = "none (SGLang's own choice)" if previous is None else previous.describe()
        results.append(_check(r.status_code == 200 and all(r.json()),
                              f"previous table restored: {was}"))
    print(f"{sum(results)} passed, {len(results) - sum(results)} failed")
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
