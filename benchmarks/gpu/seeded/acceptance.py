"""Measure a served head's acceptance per prompt family and depth from specctl's own counters.

    python -m benchmarks.gpu.seeded.acceptance --url http://127.0.0.1:30000 \
        --dataset DIR/family_a.jsonl --dataset DIR/family_b.jsonl --depths 1,2,3 [--off-spell 64]

For every dataset and depth: push a one-tier table of that depth, send `--requests` requests
at `--concurrency`, and read the depth's counters before and after: accept length =
Δspecctl_decode_tokens_total / Δspecctl_decode_request_steps_total (tokens per request per
verify, the bonus token included; docs/contract.md). From the accept lengths at depths 1..k,
the acceptance of draft position k given the earlier ones is implied:
r_k = L_k - L_(k-1) (L_0 = 1) is P(the first k drafts accepted), p_k = r_k / r_(k-1).

`--off-spell N`: the same requests twice, at depth 0 for their first N tokens before a push to
depth 3 (the deepest of --depths), and at depth 3 throughout; the accept length at depth 3 is
compared over the same stretch of the requests: from the tokens the off arm decoded at depth 0
(N a request, plus what the push's latency added) to their end. Whatever draft work the
server's depth 0 leaves out (the draft's KV extends, its prefill at admission) shows as what
the off arm accepts less once drafting resumes. Before each arm the draft's KV is scrubbed:
after a flush, as many other prompts run at depth 3, asking twice the arm's tokens, so the
slots the arm is given next hold other requests' draft KV, as on a busy server. Then the
prefix cache is flushed again (SGLang's `/flush_cache`; each arm records both), so the arm
finds neither its prompts cached nor its draft KV left in its slots by the other arm. Each
arm sends its --concurrency requests once, with no replacements as they finish (those would
start after the off arm's push, never off). The first dataset needs twice --concurrency
prompts, from the `--off-spell-from`-th on.
The table live before the run is pushed back at the end.
Works against a real SGLang server with the specctl plugin and against `specctl sim serve`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.bench.loadgen import ClosedLoop, LiveCounters, StopRule, make_client, run_level
from controller.bench.metrics import DepthWork, Scrape
from controller.bench.prompts import DatasetError, Prompt, load_dataset
from controller.bench.server_client import ServerClient, ServerError, admin_key_from_env
from controller.bench.sweep import wait_idle
from sglang_hooks.contract import PolicyTable, single_depth_table


class AcceptanceError(RuntimeError):
    """The measurement could not be made; the message says why and what to change."""


def implied_positions(accept_lengths: dict[int, float]) -> dict[int, float]:
    """P(draft k accepted | drafts 1..k-1 accepted), for each k with depths 1..k all measured.

    Each is clamped to [0, 1]: accept lengths measured on finite samples can fall (or jump) by
    more than a probability allows between neighbouring depths, and that is noise, not a rate.
    """
    out: dict[int, float] = {}
    prev_len, prev_reach = 1.0, 1.0
    k = 1
    while k in accept_lengths:
        reach = max(accept_lengths[k] - prev_len, 0.0)
        out[k] = min(reach / prev_reach, 1.0) if prev_reach > 0 else 0.0
        prev_len, prev_reach = accept_lengths[k], reach
        k += 1
    return out


def _work_at(before: Scrape, after: Scrape, depth: int) -> DepthWork:
    return after.by_depth().get(depth, DepthWork()) - before.by_depth().get(depth, DepthWork())


def _other_depths(before: Scrape, after: Scrape, depth: int) -> float:
    """Iterations counted at other depths in between (should be none while a depth is forced)."""
    a, b = after.by_depth(), before.by_depth()
    return sum(
        a[d].iterations - b.get(d, DepthWork()).iterations for d in a if d != depth
    )


@dataclass
class Session:
    server: ServerClient
    url: str
    version: int
    model: str

    def push_depth(self, depth: int) -> None:
        self.version += 1
        self.server.push(single_depth_table(depth, version=self.version))

    def fresh_scrape(self) -> Scrape:
        self.server.state()  # a /server_info read makes the plugin export its counts now
        return self.server.scrape()

    async def settled_scrape(self) -> Scrape:
        await wait_idle(self.server, timeout_s=30.0)
        return self.fresh_scrape()


async def measure_depth(
    s: Session, prompts: Sequence[Prompt], depth: int, concurrency: int, requests: int
) -> dict[str, Any]:
    s.push_depth(depth)
    before = await s.settled_scrape()
    async with make_client(s.url, concurrency) as http:
        load = await run_level(
            http, prompts, ClosedLoop(concurrency), StopRule(requests=requests, warmup_s=0.0),
            model=s.model,
        )
    after = await s.settled_scrape()
    work = _work_at(before, after, depth)
    if work.request_steps <= 0:
        raise AcceptanceError(
            f"{s.url}: no decode iterations were counted at depth {depth}; is the specctl "
            "plugin active (specctl status) and was the depth captured (specctl serve --depths)?"
        )
    return {
        "depth": depth,
        "accept_length": round(work.tokens / work.request_steps, 4),
        "iterations": work.iterations,
        "mean_batch": round(work.request_steps / work.iterations, 2) if work.iterations else None,
        "tokens": work.tokens,
        "requests": len(load.completed),
        "other_depth_iterations": _other_depths(before, after, depth),
    }


async def off_spell(
    s: Session, prompts: Sequence[Prompt], off_tokens: int, depth: int, concurrency: int,
    first_prompt: int = 0,
) -> dict[str, Any]:
    """Depth `depth` after `off_tokens` tokens: preceded by depth 0, or at `depth` all along.

    The off arm runs first. Its depth-`depth` window starts where the push took effect: the
    tokens its requests decoded at depth 0, the push's latency included. The on arm's window
    then starts at that many tokens too (read off the server's counters while it runs), so
    both arms' accept lengths cover the same stretch of their requests. Before, the on arm's
    window opened on the client's count alone, about 30 tokens a request earlier than the off
    arm's (the eighteenth run), and a request's later tokens need not draft alike.
    """
    prompts = prompts[first_prompt:]
    if len(prompts) < 2 * concurrency:
        raise AcceptanceError(
            f"the off spell needs {2 * concurrency} prompts in the first dataset from prompt "
            f"{first_prompt} (its requests and as many others to scrub the draft's KV with), "
            f"found {len(prompts)}: give a larger dataset, a lower --concurrency or a lower "
            "--off-spell-from"
        )
    arms: dict[str, Any] = {}
    batch = [Prompt(p.text, off_tokens + max(p.output_tokens, 32)) for p in prompts[:concurrency]]
    scrub = scrub_batch(batch, prompts[concurrency:2 * concurrency])
    decoded_off = float(off_tokens * len(batch))  # replaced by what the off arm measured
    for arm, first_depth in (("off_then_on", 0), ("on_throughout", depth)):
        scrubbed = await scrub_draft_kv(s, scrub, depth, concurrency)
        flushed = await _flushed_at(s, first_depth)
        start = await s.settled_scrape()
        live = LiveCounters()
        async with make_client(s.url, concurrency) as http:
            task = asyncio.create_task(run_level(
                http, batch, ClosedLoop(concurrency, once=True),
                StopRule(requests=len(batch), warmup_s=0.0),
                model=s.model,
                live=live,
            ))  # fmt: skip
            if first_depth != depth:
                while live.tokens < off_tokens * len(batch) and not task.done():
                    await asyncio.sleep(0.01)
                await asyncio.to_thread(s.push_depth, depth)
                mid = await asyncio.to_thread(s.fresh_scrape)
            else:
                mid = await _scrape_when_decoded(s, start, depth, decoded_off, task)
            load = await task
        after = await s.settled_scrape()
        if first_depth != depth:
            decoded_off = _work_at(start, after, first_depth).tokens
        work = _work_at(mid, after, depth)
        before_window = decoded_off if first_depth != depth else _work_at(start, mid, depth).tokens
        arms[arm] = {
            "accept_length": round(work.tokens / work.request_steps, 4)
            if work.request_steps else None,
            "request_steps": work.request_steps,
            "requests": len(load.completed),
            "window_from_token": round(before_window / len(batch), 1),
            "prefix_cache_flushed": flushed,
            "draft_kv_scrubbed": scrubbed,
        }
    on, off = arms["on_throughout"]["accept_length"], arms["off_then_on"]["accept_length"]
    return {
        "off_tokens": off_tokens,
        "depth": depth,
        **arms,
        "loss": round(on - off, 4) if on is not None and off is not None else None,
    }


async def _scrape_when_decoded(
    s: Session, start: Scrape, depth: int, tokens: float, task: asyncio.Task[Any]
) -> Scrape:
    """The first scrape with `tokens` decoded at `depth` since `start` (or the last one, if
    the requests end first)."""
    while True:
        now = await asyncio.to_thread(s.fresh_scrape)
        if _work_at(start, now, depth).tokens >= tokens or task.done():
            return now
        await asyncio.sleep(0.005)


async def _flushed_at(s: Session, depth: int) -> bool:
    """`depth` pushed, the server idle, then SGLang's cache flushed: whether it answered."""
    s.push_depth(depth)
    await wait_idle(s.server, timeout_s=30.0)
    return await asyncio.to_thread(s.server.flush_cache)


def scrub_batch(batch: Sequence[Prompt], others: Sequence[Prompt]) -> list[Prompt]:
    """Other prompts, each asking twice as many tokens as the arm's longest request, so that
    after a flush they fill at least the KV slots the arm's requests will be given."""
    tokens = 2 * max(p.output_tokens for p in batch)
    return [Prompt(p.text, tokens) for p in others]


async def scrub_draft_kv(
    s: Session, scrub: Sequence[Prompt], depth: int, concurrency: int
) -> bool:
    """Write other requests' draft KV into the slots an arm is about to be given.

    A flush resets SGLang's slot allocator but leaves the KV pools' contents, and an arm's
    requests are given the same slots, in the same order, as the last requests sent after the
    last flush. Without this, the off arm would find its draft KV where the on arm (the same
    prompts, the same greedy tokens) wrote it, and no skipped draft work would show: sixteenth
    and seventeenth runs, docs/sglang.md. Sent at `depth`, so the draft writes its KV for
    every position; the flush before makes the slots given out start where the arm's will.
    Returns whether its flush was answered (the arm records its own)."""
    flushed = await _flushed_at(s, depth)
    async with make_client(s.url, concurrency) as http:
        await run_level(
            http, scrub, ClosedLoop(concurrency, once=True),
            StopRule(requests=len(scrub), warmup_s=0.0),
            model=s.model,
        )  # fmt: skip
    await wait_idle(s.server, timeout_s=30.0)
    return flushed


async def run(
    url: str,
    admin_key: str | None,
    datasets: Sequence[Path],
    depths: Sequence[int],
    concurrency: int,
    requests: int,
    off_tokens: int | None,
    off_from: int = 0,
) -> dict[str, Any]:
    try:
        families = {p.stem: load_dataset(p, default_output_tokens=128) for p in datasets}
    except DatasetError as err:
        raise AcceptanceError(str(err)) from None
    with ServerClient(url, admin_key) as server:
        before = server.state()
        missing = [d for d in (*depths, 0) if d not in before.captured_depths]
        if before.inactive_reason or missing:
            raise AcceptanceError(
                f"{url}: " + (before.inactive_reason or
                f"depths {missing} were not captured (captured: {list(before.captured_depths)});"
                " start the server with specctl serve --depths covering them")
            )  # fmt: skip
        s = Session(server, url, before.version, server.model_id() or "default")
        result: dict[str, Any] = {"url": url, "concurrency": concurrency,
                                  "requests": requests, "families": {}}  # fmt: skip
        try:
            for name, prompts in families.items():
                rows = [await measure_depth(s, prompts, d, concurrency, requests) for d in depths]
                lengths = {r["depth"]: r["accept_length"] for r in rows}
                result["families"][name] = {
                    "depths": rows,
                    "per_position": {
                        str(k): round(v, 4) for k, v in implied_positions(lengths).items()
                    },
                }
            if off_tokens:
                first = next(iter(families.values()))
                result["off_spell"] = await off_spell(
                    s, first, off_tokens, max(depths), concurrency, off_from
                )
        finally:
            _restore(s, before.table)
    return result


def _restore(s: Session, table: PolicyTable | None) -> None:
    try:
        if table is None:
            s.server.push(None)
        else:
            s.version += 1
            s.server.push(PolicyTable.build(table.tiers, version=s.version))
    except ServerError as err:
        print(f"warning: could not push back the table live before: {err}", file=sys.stderr)


def render(result: dict[str, Any]) -> str:
    lines = ["| family | depth | accept length | mean batch | iterations |",
             "| --- | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for name, fam in result["families"].items():
        for row in fam["depths"]:
            lines.append(f"| {name} | {row['depth']} | {row['accept_length']:.3f} | "
                         f"{row['mean_batch']} | {row['iterations']:.0f} |")  # fmt: skip
    for name, fam in result["families"].items():
        pos = ", ".join(f"p{k} {v:.3f}" for k, v in fam["per_position"].items())
        lines.append(f"\n{name}: implied per-position acceptance {pos}")
    if spell := result.get("off_spell"):
        lines.append(
            f"\noff spell: depth {spell['depth']} after {spell['off_tokens']} tokens: accept "
            f"length {spell['on_throughout']['accept_length']} at depth {spell['depth']} "
            f"throughout, {spell['off_then_on']['accept_length']} after depth 0 "
            f"(loss {spell['loss']}; from token {spell['off_then_on']['window_from_token']} "
            f"and {spell['on_throughout']['window_from_token']} a request)"
        )
    return "\n".join(lines)


def _depth_list(text: str) -> list[int]:
    try:
        depths = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--depths {text!r}: give integers like 1,2,3") from None
    if not depths or depths[0] < 1:
        raise argparse.ArgumentTypeError(f"--depths {text!r}: give draft depths >= 1")
    return depths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", required=True, help="the speculative server")
    parser.add_argument("--dataset", type=Path, action="append", required=True,
                        help="a JSONL prompt file (repeat for several families)")  # fmt: skip
    parser.add_argument("--depths", type=_depth_list, default=[1, 2, 3])
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--requests", type=int, default=32, help="per family and depth")
    parser.add_argument("--off-spell", type=int, default=None, metavar="N",
                        help="also measure depth 3 after N tokens at depth 0")  # fmt: skip
    parser.add_argument("--off-spell-from", type=int, default=0, metavar="K",
                        help="the off spell's prompts start at the first dataset's K-th "
                        "(another K, other requests: rounds that are not repeats)")  # fmt: skip
    parser.add_argument("--admin-key", default=None, help="or SPECCTL_ADMIN_KEY")
    parser.add_argument("--out", type=Path, default=None, help="write the result as JSON")
    args = parser.parse_args(argv)
    if args.concurrency < 1 or args.requests < 1 or (args.off_spell is not None
                                                      and args.off_spell < 1):  # fmt: skip
        print("error: --concurrency, --requests and --off-spell must be >= 1", file=sys.stderr)
        return 2
    if args.off_spell_from < 0:
        print("error: --off-spell-from must be >= 0 (a prompt's index)", file=sys.stderr)
        return 2
    try:
        result = asyncio.run(run(
            args.url, admin_key_from_env(args.admin_key), args.dataset, args.depths,
            args.concurrency, args.requests, args.off_spell, args.off_spell_from,
        ))  # fmt: skip
    except (AcceptanceError, ServerError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(render(result))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
