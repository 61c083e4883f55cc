"""GPU smoke test for the SGLang plugin: run it against a server started with `specctl serve`.

    python -m sglang_hooks.smoke --url http://127.0.0.1:30000 [--admin-key KEY]

It checks, on a real server: the plugin is loaded and active (/server_info), a pushed table
is applied ([true]) and reported, a malformed and an uncaptured-depth table get HTTP 400,
and, while a few concurrent requests decode, each forced depth makes its own per-depth
counter move on /metrics; at the end it puts back the table that was live before (a start-up
policy table, a daemon's push, or none). It needs a GPU server; it has not been run in
specctl's CI, which has no GPU (see docs/sglang.md).
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from sglang_hooks.contract import (
    METRIC_ITERATIONS,
    PolicyTable,
    Tier,
    parse_table,
    push_body,
    read_server_state,
    single_depth_table,
)

ADMIN_KEY_ENV = "SPECCTL_ADMIN_KEY"  # the same variable `specctl bench` and `status` read


def _iterations_by_depth(client: httpx.Client) -> dict[str, float]:
    text = client.get("/metrics").text
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text):
        if fam.name == METRIC_ITERATIONS:
            for s in fam.samples:
                if s.name.endswith("_total"):
                    out[s.labels["depth"]] = out.get(s.labels["depth"], 0.0) + s.value
    return out


def _load(client: httpx.Client, stop: threading.Event, model: str) -> None:
    body = {"text": "Count slowly from one to two hundred:", "sampling_params":
            {"max_new_tokens": 256, "temperature": 0}}
    while not stop.is_set():
        try:
            client.post("/generate", json=body, timeout=120)
        except httpx.HTTPError:
            time.sleep(0.5)


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
    ap.add_argument("--concurrency", type=int, default=4,
                    help="generate requests kept in flight while depths are forced "
                    "(default: %(default)s)")
    ap.add_argument("--seconds-per-depth", type=float, default=15.0,
                    help="how long each forced depth runs before its counters are compared "
                    "(default: %(default)s)")
    args = ap.parse_args(argv)
    headers: dict[str, Any] = {}
    if args.admin_key:
        headers["Authorization"] = f"Bearer {args.admin_key}"
    client = httpx.Client(base_url=args.url, headers=headers, timeout=30)
    results = []

    [state] = read_server_state(client.get("/server_info").json())[:1]
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
    uncaptured = next(d for d in range(16) if d not in captured)
    r = client.post("/set_internal_state",
                    json=push_body(single_depth_table(uncaptured, version=2)))
    results.append(_check(r.status_code == 400 and "not captured" in r.text,
                          f"uncaptured depth {uncaptured} refused with 400 ({r.status_code})"))

    stop = threading.Event()
    workers = [threading.Thread(target=_load, args=(httpx.Client(base_url=args.url), stop, ""),
                                daemon=True) for _ in range(args.concurrency)]
    for w in workers:
        w.start()
    try:
        for version, depth in enumerate((captured[0], captured[-1]), start=10):
            r = client.post("/set_internal_state",
                            json=push_body(single_depth_table(depth, version=version)))
            results.append(_check(r.status_code == 200 and all(r.json()),
                                  f"push of depth {depth} applied: {r.text}"))
            live = read_server_state(client.get("/server_info").json())
            results.append(_check(all(s["version"] == version for s in live),
                                  f"/server_info shows version {version} on every rank"))
            before = _iterations_by_depth(client)
            time.sleep(args.seconds_per_depth)
            after = _iterations_by_depth(client)
            moved = {d: after.get(d, 0) - before.get(d, 0) for d in after}
            results.append(_check(moved.get(str(depth), 0) > 0 and all(
                v == 0 for d, v in moved.items() if d != str(depth)),
                f"only depth {depth} counters moved: {moved}"))
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
