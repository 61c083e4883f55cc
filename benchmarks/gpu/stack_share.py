"""Shares of a process's time by Python function, from py-spy's collapsed stacks
(`py-spy record --format raw`, what `benchmarks.gpu.host_watch --py-spy` writes).

    python -m benchmarks.gpu.stack_share show stacks.txt --top 30
    python -m benchmarks.gpu.stack_share compare plain/stacks.txt d0/stacks.txt --top 30
    python -m benchmarks.gpu.stack_share compare --busy --per-pass plain/stacks.txt d0/stacks.txt
    python -m benchmarks.gpu.stack_share lines --per-pass d0/stacks.txt eagle_prepare_for_decode

Only the samples of one thread count (`--thread`, default the main thread, where SGLang's
scheduler runs its loop; py-spy's `--threads` puts `thread (ID): NAME` first on each stack).
A function's inclusive share is the fraction of samples with it anywhere on the stack (counted
once per sample however often it recurs), its own share the fraction with it on top. Line
numbers are dropped, so one function's call sites merge. `compare` prints both files' shares
and the change, the largest changes first: with one scheduler iteration per GPU forward, a
share times the iteration time is the host time it took.

`--busy` leaves out of every function the samples that wait on the GPU (a frame named
`WAIT_FRAME` anywhere on the stack), while they still count in the total: a function's share is
then the host time it kept the process busy, so two servers sampled over windows of the same
length compare by the work each did on the host, not by how long each waited.

`--per-pass` turns each share into host milliseconds per decode iteration: the share times the
window, over the decode iterations the server counted in it, both read from the host.json that
`host_watch` writes beside the stacks. Two servers that ran at different rates then compare by
what each iteration cost, not by how much of a window it filled; the prefill batches per decode
iteration are printed with them, as they cost host time of their own.

`lines` splits one function's inclusive share by where in it the time went: its line, and the
function that line was in (`(own)` where the sample stopped in the function itself, which
includes C code such as a tensor operation's). The function is named as the tables print it,
or by its bare name (any file's; the outermost on a stack counts).
"""

from __future__ import annotations

import argparse
import gzip
import json
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_LINE = re.compile(r":\d+\)$")
_LINE_NUMBER = re.compile(r":(\d+)\)$")
MAIN_THREAD = "MainThread"
WAIT_FRAME = "Event.synchronize"  # where SGLang's scheduler waits for a forward's results


def frame_key(frame: str) -> str:
    """`process_batch_result (sglang/srt/managers/scheduler.py:1234)` -> without the line, and
    the file shortened to its last two parts."""
    frame = _LINE.sub(")", frame.strip())
    name, sep, where = frame.partition(" (")
    if not sep:
        return name
    parts = where.rstrip(")").split("/")
    return f"{name} ({'/'.join(parts[-2:])})"


@dataclass
class Shares:
    samples: int
    inclusive: Counter[str]
    own: Counter[str]

    def share(self, key: str, own: bool = False) -> float:
        counts = self.own if own else self.inclusive
        return counts[key] / self.samples if self.samples else 0.0


def _samples(text: str, thread: str) -> Iterator[tuple[int, list[str]]]:
    """(count, raw frames outermost first) of each stack of `thread` ("": every thread's)."""
    for line in text.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        raw = [f for f in stack.split(";") if f.strip()]
        if raw and raw[0].startswith("thread ("):
            if thread and raw[0].partition("): ")[2].strip() != thread:
                continue
            raw = raw[1:]
        if raw:
            yield int(count), raw


def _waits(frames: list[str]) -> bool:
    return any(f.startswith(WAIT_FRAME + " (") or f == WAIT_FRAME for f in frames)


def _counted(text: str, thread: str, busy: bool
             ) -> tuple[int, list[tuple[int, list[str], list[str]]]]:
    """(the thread's samples, its stacks as (count, raw frames, keys) less those waiting on the
    GPU when `busy`)."""
    total, kept = 0, []
    for n, raw in _samples(text, thread):
        frames = [frame_key(f) for f in raw]
        total += n
        if not (busy and _waits(frames)):
            kept.append((n, raw, frames))
    return total, kept


def parse(text: str, thread: str = MAIN_THREAD, busy: bool = False) -> Shares:
    """`thread`: the thread whose samples count, by name ("": every thread's). `busy`: samples
    waiting on the GPU count in the total only."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    total, stacks = _counted(text, thread, busy)
    for n, _, frames in stacks:
        for key in set(frames):
            inclusive[key] += n
        own[frames[-1]] += n
    return Shares(total, inclusive, own)


OWN = "(own)"


def parse_lines(text: str, function: str, thread: str = MAIN_THREAD,
                busy: bool = False) -> tuple[int, Counter[tuple[int, str]]]:
    """(samples of the thread, samples with `function` on the stack by (its line, the
    function that line was in or OWN)). `function`: a key as `frame_key` makes it, or a bare
    name."""
    where: Counter[tuple[int, str]] = Counter()
    total, stacks = _counted(text, thread, busy)
    for n, raw, frames in stacks:
        at = next((i for i, key in enumerate(frames)
                   if key == function or key.partition(" (")[0] == function), None)
        if at is None:
            continue
        number = _LINE_NUMBER.search(raw[at].strip())
        callee = frames[at + 1] if at + 1 < len(frames) else OWN
        where[(int(number[1]) if number else 0, callee)] += n
    return total, where


def _read(path: Path) -> str:
    """A raw stacks file, or one compressed with gzip (`.gz`, as results are checked in)."""
    if path.suffix == ".gz":
        with gzip.open(path, "rt", errors="replace") as f:
            return f.read()
    return path.read_text(errors="replace")


def _no_samples(path: Path, thread: str) -> SystemExit:
    which = f" of thread {thread!r}" if thread else ""
    return SystemExit(f"error: {path} holds no py-spy samples{which} (a `--format raw` file? "
                      "--thread '' counts every thread)")


def load(path: Path, thread: str = MAIN_THREAD, busy: bool = False) -> Shares:
    shares = parse(_read(path), thread, busy)
    if not shares.samples:
        raise _no_samples(path, thread)
    return shares


def lines(path: Path, function: str, top: int, thread: str = MAIN_THREAD, busy: bool = False,
          window: Window | None = None) -> list[str]:
    """Where `function`'s time went in the stacks at `path`, the largest first; with `window`,
    in host ms per decode iteration."""
    total, where = parse_lines(_read(path), function, thread, busy)
    if not total:
        raise _no_samples(path, thread)
    if not where:
        raise SystemExit(f"error: {function!r} is on none of the {total} stacks of {path} "
                         "(name it as `show` prints it, or by its bare name)")
    scale = window.ms_per_share if window is not None else 100.0
    unit = "host ms per decode iteration" if window is not None else "% of samples"
    inside = sum(where.values())
    out = [] if window is None else [window.describe(path.parent.name or "stacks")]
    out += [f"{function}: {inside / total * scale:.3f} ({unit}), {inside} of {total} samples",
            f"{'share':>8}  line  called"]
    for (number, callee), n in sorted(where.items(), key=lambda kv: (-kv[1], kv[0]))[:top]:
        out.append(f"{n / total * scale:8.3f}  {number:>4}  {callee}")
    return out


def show(s: Shares, top: int) -> list[str]:
    lines = [f"{s.samples} samples", f"{'inclusive':>9} {'own':>6}  function"]
    for key, n in s.inclusive.most_common(top):
        lines.append(f"{n / s.samples:9.1%} {s.share(key, own=True):6.1%}  {key}")
    return lines


@dataclass(frozen=True)
class Window:
    """What host_watch measured beside a stacks file: its window and the server's passes."""

    seconds: float
    decode_passes: int
    prefill_passes: int

    FIELDS = ("decode_passes", "prefill_passes")

    @classmethod
    def read(cls, data: dict[str, Any], seconds_key: str = "seconds") -> Window | None:
        """From a record with the window's seconds and both pass counts, the seconds and the
        decode ones above 0; None otherwise (a record from before passes were counted, or a
        window without a decode iteration)."""
        seconds, decode, prefill = (data.get(k) for k in (seconds_key, *cls.FIELDS))
        if not (isinstance(seconds, (int, float)) and isinstance(decode, (int, float))
                and isinstance(prefill, (int, float))) or seconds <= 0 or decode <= 0:
            return None
        return cls(float(seconds), int(decode), int(prefill))

    @property
    def ms_per_share(self) -> float:
        """Host milliseconds per decode iteration that a share of 1.0 stands for."""
        return 1000.0 * self.seconds / self.decode_passes

    def describe(self, name: str) -> str:
        return (f"{name}: {self.seconds:.1f} s, {self.decode_passes} decode iterations, "
                f"{self.prefill_passes} prefill batches "
                f"({self.prefill_passes / self.decode_passes:.2f} a decode iteration)")


def window_beside(stacks: Path) -> Window:
    """The host.json in the stacks file's folder; SystemExit naming what is missing."""
    path = stacks.parent / "host.json"
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as err:
        raise SystemExit(f"error: --per-pass reads {path}, which host_watch writes beside the "
                         f"stacks: {err}") from None
    window = Window.read(data)
    if window is not None:
        return window
    missing = [f for f in ("seconds", *Window.FIELDS)
               if not isinstance(data.get(f), (int, float))]
    if missing:
        raise SystemExit(f"error: {path} has no {', '.join(missing)} (a host_watch from before "
                         "it counted the server's passes, or a server without a pass counter); "
                         "compare without --per-pass")
    if data["seconds"] <= 0:
        raise SystemExit(f"error: {path}: a window of {data['seconds']} s")
    raise SystemExit(f"error: {path}: the server ran no decode iteration in the window")


def compare(a: Shares, b: Shares, top: int, names: tuple[str, str],
            windows: tuple[Window, Window] | None = None) -> list[str]:
    """The largest changes first; with `windows`, in host ms per decode iteration."""
    scale = (1.0, 1.0) if windows is None else (windows[0].ms_per_share,
                                                windows[1].ms_per_share)

    def value(s: Shares, key: str, i: int) -> float:
        return s.share(key) * scale[i]

    keys = set(a.inclusive) | set(b.inclusive)
    # Ties by name: the same stacks print the same table (a set's order varies by process).
    rows = sorted(keys, key=lambda k: (-abs(value(b, k, 1) - value(a, k, 0)), k))[:top]
    head = f"{names[0][:12]:>12} {names[1][:12]:>12} {'change':>8}"
    if windows is None:
        lines = [f"samples: {a.samples} / {b.samples}; inclusive shares", f"{head}  function"]
        for key in rows:
            sa, sb = a.share(key), b.share(key)
            lines.append(f"{sa:12.1%} {sb:12.1%} {100 * (sb - sa):+7.1f}%  {key}")
        return lines
    lines = [windows[0].describe(names[0]), windows[1].describe(names[1]),
             f"samples: {a.samples} / {b.samples}; host ms per decode iteration, inclusive",
             f"{head}  function"]
    for key in rows:
        ma, mb = value(a, key, 0), value(b, key, 1)
        lines.append(f"{ma:12.3f} {mb:12.3f} {mb - ma:+8.3f}  {key}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    one = sub.add_parser("show", help="one file's functions, the most inclusive first")
    one.add_argument("stacks", type=Path)
    one.add_argument("--top", type=int, default=30)
    one.add_argument("--thread", default=MAIN_THREAD, help="thread name ('': every thread)")
    two = sub.add_parser("compare", help="two files' shares, the largest change first")
    two.add_argument("before", type=Path)
    two.add_argument("after", type=Path)
    two.add_argument("--top", type=int, default=30)
    two.add_argument("--thread", default=MAIN_THREAD, help="thread name ('': every thread)")
    where = sub.add_parser("lines", help="one function's time by its line and what it called")
    where.add_argument("stacks", type=Path)
    where.add_argument("function", help="as `show` prints it, or its bare name")
    where.add_argument("--top", type=int, default=20)
    where.add_argument("--thread", default=MAIN_THREAD, help="thread name ('': every thread)")
    for p in (one, two, where):
        p.add_argument("--busy", action="store_true",
                       help="samples waiting on the GPU count in the total, for no function")
    for p in (two, where):
        p.add_argument("--per-pass", action="store_true",
                       help="host ms per decode iteration (reads host.json beside each file)")
    args = ap.parse_args(argv)
    if args.cmd == "show":
        print("\n".join(show(load(args.stacks, args.thread, args.busy), args.top)))
    elif args.cmd == "lines":
        window = window_beside(args.stacks) if args.per_pass else None
        print("\n".join(lines(args.stacks, args.function, args.top, args.thread, args.busy,
                              window)))
    else:
        names = (args.before.parent.name or "before", args.after.parent.name or "after")
        windows = ((window_beside(args.before), window_beside(args.after))
                   if args.per_pass else None)
        before = load(args.before, args.thread, args.busy)
        after = load(args.after, args.thread, args.busy)
        print("\n".join(compare(before, after, args.top, names, windows)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
