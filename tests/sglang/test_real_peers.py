"""TP ranks agree before a table steers: real torch.distributed tp_store on loopback.

Real: `torch.distributed.TCPStore` (master and one client per simulated rank, wrapped in a
`PrefixStore` as `init_process_group` wraps its own), and, end to end, two processes that
join a real gloo process group over tcp:// on loopback, the way SGLang's model runner
initialises torch.distributed, and use its default store through `default_peer_check()`.
No stand-ins: the ranks differ only in what the plugin publishes.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.peers import VERDICT_KEY, PeerCheck
from sglang_hooks.runtime import SchedulerRuntime

ROOT = Path(__file__).resolve().parents[2]
TABLE = PolicyTable.build([Tier(1, 2), Tier(8, 0, hysteresis=2)], 3)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _rank(store: Any, rank: int, world: int, wait_s: float = 0.3) -> tuple[SchedulerRuntime,
                                                                            PeerCheck]:
    rt = SchedulerRuntime(timer=HostIntervalTimer())
    return rt, PeerCheck(store, rank, world, wait_s=wait_s)


def test_ranks_with_the_same_state_steer_with_their_start_up_table(tp_store: Any) -> None:
    ranks = [_rank(tp_store(), r, 3) for r in range(3)]
    for rt, peers in ranks:
        peers.publish("same")
        rt.activate({0, 2}, TABLE, peers)
        assert rt.table is None  # not before the ranks agree
    for rt, _ in ranks:
        assert rt.choose(4) == 2  # first decode launch: agree, then the start-up table
        assert rt.active and rt.source == "startup"


def test_a_rank_without_the_plugin_makes_every_plugin_rank_refuse_within_the_bound(
    tp_store: Any,
) -> None:
    ranks = [_rank(tp_store(), r, 3) for r in range(2)]  # rank 2 never publishes
    for rt, peers in ranks:
        peers.publish("same")
        rt.activate({0, 2}, TABLE, peers)
    verdicts: list[dict[str, Any]] = []
    threads = [threading.Thread(target=lambda rt=rt: verdicts.append(rt.report()))
               for rt, _ in ranks]
    start = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert not any(t.is_alive() for t in threads), "the check blocked beyond its bound"
    assert time.monotonic() - start < 10
    assert [v["active"] for v in verdicts] == [False, False]
    assert verdicts[0]["inactive_reason"] == verdicts[1]["inactive_reason"]
    assert "TP rank(s) [2] of 3 published no specctl state" in verdicts[0]["inactive_reason"]
    for rt, _ in ranks:
        assert rt.choose(20) is None  # SGLang's own choice, as on the rank without the plugin


def test_ranks_that_differ_refuse_and_a_late_rank_adopts_the_verdict(tp_store: Any) -> None:
    ranks = [_rank(tp_store(), r, 3, wait_s=0.2) for r in range(3)]
    ranks[0][1].publish("table v3")
    ranks[1][1].publish("table v3")
    for rt, peers in ranks[:2]:
        rt.activate({0, 2}, TABLE, peers)
    ranks[0][0].settle_peers()  # rank 2 is still starting: rank 0 times out and refuses
    late_rt, late_peers = ranks[2]
    late_peers.publish("table v3")  # ... then rank 2 arrives with the same state
    late_rt.activate({0, 2}, TABLE, late_peers)
    late_rt.settle_peers()
    ranks[1][0].settle_peers()
    reasons = {rt.inactive_reason for rt, _ in ranks}
    assert len(reasons) == 1 and all(not rt.active for rt, _ in ranks)  # one verdict for all

    other = [_rank(tp_store(), r, 2) for r in range(2)]
    other[0][1].store.delete_key(VERDICT_KEY)
    for (rt, peers), state in zip(other, ("table v3", "table v4"), strict=True):
        peers.publish(state)
        rt.activate({0, 2}, TABLE, peers)
    for rt, _ in other:
        rt.settle_peers()
        assert not rt.active and "TP ranks disagree" in (rt.inactive_reason or "")
        assert "table v4" in (rt.inactive_reason or "")


_RANK_SCRIPT = """
import json, sys
import torch.distributed as dist
from sglang_hooks.contract import PolicyTable, Tier
from sglang_hooks.gpu_timer import HostIntervalTimer
from sglang_hooks.peers import default_peer_check
from sglang_hooks.runtime import SchedulerRuntime
rank, port, state = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=2, rank=rank)
peers = default_peer_check(wait_s=1.0)
rt = SchedulerRuntime(timer=HostIntervalTimer())
if state != "absent":  # "absent": this rank runs without the plugin
    peers.publish(state)
    rt.activate({0, 2}, PolicyTable.build([Tier(1, 2)], 3), peers)
dist.barrier()  # both ranks serve: they are past start-up
report = rt.report()
dist.barrier()
print(json.dumps({"active": report["active"], "reason": report["inactive_reason"],
                  "source": report["source"], "ranks": report["tp_ranks_checked"]}))
"""


def _group(states: tuple[str, str]) -> list[dict[str, Any]]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    procs = [subprocess.Popen([sys.executable, "-c", _RANK_SCRIPT, str(r), str(port), s],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for r, s in enumerate(states)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr[-2000:]
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def test_the_default_process_group_store_carries_the_agreement() -> None:
    same = _group(("v3", "v3"))
    assert [r["source"] for r in same] == ["startup", "startup"]
    assert [r["ranks"] for r in same] == [2, 2]
    absent = _group(("v3", "absent"))
    assert not absent[0]["active"] and "TP rank(s) [1] of 2" in absent[0]["reason"]
