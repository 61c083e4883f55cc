"""`daemon`: `specctl daemon` against the speculative server under a stepped load (levels of
--daemon-concurrency in turn): the samples it stored, the pushes it made and the table live at
the end. The table live before is pushed back after.
"""

from __future__ import annotations

import json
from typing import Any

from benchmarks.gpu import daemon_run, servers
from benchmarks.gpu.context import Run, StepError
from benchmarks.gpu.options import int_list
from controller.bench.server_client import ServerClient


def run(run: Run) -> dict[str, Any]:
    run.require_servers(servers.SPEC)  # the plain server is not needed here
    o = run.opts
    folder = run.dir / "daemon"
    folder.mkdir(parents=True, exist_ok=True)
    store = folder / "daemon.sqlite"
    for stale in folder.glob("daemon.sqlite*"):
        stale.unlink()  # a rerun measures afresh
    seconds = min(o.daemon_seconds, run.time_left() - o.daemon_segment - 30)
    if seconds < o.daemon_seconds:
        if seconds < 10:
            raise StepError(f"the --budget leaves {run.time_left():.0f} s, too little for a "
                            "daemon run; give this step a command of its own")
        run.say(f"  the --budget shortens the daemon run to {seconds:.0f} s")
    config = daemon_run.daemon_config(run.url(servers.SPEC), run.admin_key, store, seconds)
    daemon_run.write_config(folder / "daemon.yaml", config)
    with ServerClient(run.url(servers.SPEC)) as probe:
        model = probe.model_id() or "default"
        before = probe.state()
    load = daemon_run.SteppedLoad(
        run.url(servers.SPEC), run.load_prompts(),
        int_list(o.daemon_concurrency, "daemon-concurrency"), o.daemon_segment, model,
    ).start()  # fmt: skip
    try:
        done = daemon_run.run_daemon(folder / "daemon.yaml", folder / "daemon.log",
                                     run.cap(seconds + 60))
    finally:
        load_stopped = load.stop(timeout_s=o.daemon_segment + 60)
    with ServerClient(run.url(servers.SPEC), run.admin_key) as server:
        after = server.state()
        server.push(before.table)  # hand the server back as the step found it
    pushes = daemon_run.read_pushes(store)
    (folder / "pushes.json").write_text(json.dumps(pushes, indent=2) + "\n")
    (folder / "load.json").write_text(json.dumps(load.segments, indent=2) + "\n")
    outcomes: dict[str, int] = {}
    for p in pushes:
        outcomes[p["outcome"]] = outcomes.get(p["outcome"], 0) + 1
    result = {
        "returncode": done.returncode, "seconds": round(done.seconds, 1),
        "samples_stored": daemon_run.count_samples(store), "pushes": len(pushes),
        "push_outcomes": outcomes, "table_at_end": after.describe(),
        "table_source_at_end": after.source, "restored": before.describe(),
        "load_segments": len(load.segments), "load_error": load.error,
        "load_stopped": load_stopped,
        "push_lines": [line for line in (folder / "daemon.log").read_text(
            errors="replace").splitlines() if " push " in line][:20],
    }
    run.say(f"  daemon: {result['samples_stored']} samples, {len(pushes)} pushes {outcomes}, "
            f"table at the end: {after.describe()}")
    if done.timed_out or (done.returncode not in (0, None)):
        raise StepError(f"daemon: {done.describe()}", result)
    if load.error:
        raise StepError(f"daemon load failed: {load.error}", result)
    return result
