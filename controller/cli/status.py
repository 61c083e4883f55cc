"""`specctl status`: a server's live table, the depth it runs, recent per-depth tok/s, the daemon.

Recent numbers come from two `/metrics` scrapes `--window` seconds apart: deltas of the
contract's per-(depth, bucket) counters give, per depth, the decode tok/s while that depth ran
(tokens / GPU seconds), its share of the output over the window, acceptance length and mean
batch size. Nothing is pushed; no admin key is needed unless the server guards its reads.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controller.cli import app
from controller.cli.args import ADMIN_KEY_ENV, API_KEY_ENV, API_KEY_HELP

if TYPE_CHECKING:
    from rich.panel import Panel

    from controller.bench.metrics import Scrape
    from controller.bench.server_client import ServerClient

DAEMON_PREFIX = "specctl_daemon_"
MIN_WINDOW_S = 0.5


@dataclass
class DepthActivity:
    depth: int
    iterations: float
    iteration_share: float
    mean_batch: float | None
    accept_length: float | None
    step_ms: float | None
    decode_tok_per_s: float | None  # while this depth ran
    output_tok_per_s: float  # this depth's tokens over the whole window
    shape: str | None = None  # a draft tree of a shape server (`depth` its steps)

    @property
    def label(self) -> str:
        return self.shape or ("off" if self.depth == 0 else f"d{self.depth}")


@dataclass
class ServerStatus:
    url: str
    error: str | None = None
    table: dict[str, Any] | None = None
    table_text: str | None = None
    source: str | None = None
    version: int | None = None
    fingerprint: str | None = None  # of the live table: versions can repeat, this cannot
    captured_depths: list[int] = field(default_factory=list)
    captured_trees: list[str] = field(default_factory=list)  # shape labels, e.g. 3x4x16
    last_rejection: str | None = None
    active: bool | None = None  # whether the plugin steers this server (None: not read)
    inactive_reason: str | None = None  # why it does not
    off_path: dict[str, Any] | None = None  # what depth 0 runs: the path and its pieces
    off_path_text: str | None = None
    shapes: dict[str, Any] | None = None  # a server that switches draft shapes: its report
    shapes_text: str | None = None
    ranks: int | None = None
    depth_in_use: float | None = None  # sglang:spec_num_steps
    running_requests: float | None = None
    queued_requests: float | None = None
    window_s: float | None = None
    depths: list[DepthActivity] = field(default_factory=list)
    # Whether the server ran decode iterations during the window (None: not measured). The
    # gauges above are SGLang's last published values: with nothing decoding they may be old.
    decoding: bool | None = None
    metrics_note: str | None = None
    key_refused: bool = False  # the error is a 401: a key is missing or wrong

    @property
    def gauges_busy(self) -> bool:
        return bool(self.running_requests or self.queued_requests)


def activity(before: Scrape, after: Scrape, window_s: float) -> list[DepthActivity]:
    """Decode work per depth in the window, then per draft tree on a shape server."""
    from controller.bench.metrics import DepthWork, tree_work_between, work_between
    from sglang_hooks.draft_shape import ShapeError, parse_shape

    rows: list[tuple[int, str | None, DepthWork]] = [
        (d, None, w) for d, w in sorted(work_between(before, after).items())]
    for name, w in sorted(tree_work_between(before, after).items()):
        try:
            tree = parse_shape(name)
        except ShapeError:
            continue  # a label the plugin would not write: not shown
        rows.append((0 if tree is None else tree.steps, name, w))
    all_iters = sum(w.iterations for _, _, w in rows)
    return [
        DepthActivity(
            depth=d,
            iterations=w.iterations,
            iteration_share=w.iterations / all_iters if all_iters else 0.0,
            mean_batch=w.mean_batch,
            accept_length=w.accept_length,
            step_ms=w.step_ms,
            decode_tok_per_s=w.decode_tok_per_s,
            output_tok_per_s=w.tokens / window_s if window_s > 0 else 0.0,
            shape=name,
        )
        for d, name, w in rows
    ]


def read_daemon(url: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The daemon's own metrics by target: {target: {metric: value}} (+ an error if any)."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        resp = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s)
    except httpx.HTTPError as err:
        return {"url": url, "error": f"cannot reach {url} ({type(err).__name__}: {err})"}
    if resp.status_code != 200:
        return {"url": url, "error": f"GET {url}/metrics answered {resp.status_code}"}
    targets: dict[str, dict[str, float]] = {}
    try:
        for family in text_string_to_metric_families(resp.text):
            for s in family.samples:
                if not s.name.startswith(DAEMON_PREFIX) or s.name.endswith("_created"):
                    continue
                name = s.name.removeprefix(DAEMON_PREFIX).removesuffix("_total")
                if "outcome" in s.labels:
                    name += f"[{s.labels['outcome']}]"
                elif "kind" in s.labels:
                    name += f"[{s.labels['kind']}]"
                owner = s.labels.get("target") or s.labels.get("group") or "-"
                slot = targets.setdefault(owner, {})
                slot[name] = slot.get(name, 0.0) + float(s.value)
    except ValueError as err:
        return {"url": url, "error": f"{url}/metrics is not Prometheus text: {err}"}
    if not targets:
        return {
            "url": url,
            "error": f"{url}/metrics has no {DAEMON_PREFIX}* series; is it the daemon?",
        }
    return {"url": url, "error": None, "targets": targets}


def collect(
    urls: list[str], admin_key: str | None, window_s: float, api_key: str | None = None
) -> list[ServerStatus]:
    from controller.bench.server_client import ServerClient, ServerError

    statuses = [ServerStatus(url=u) for u in urls]
    clients = [ServerClient(u, admin_key, api_key=api_key) for u in urls]
    first: list[Scrape | None] = []
    try:
        for st, client in zip(statuses, clients, strict=True):
            first.append(_read_state_and_scrape(st, client))
        t0 = time.monotonic()
        if any(s is not None for s in first):
            time.sleep(window_s)
        elapsed = time.monotonic() - t0
        for st, client, before in zip(statuses, clients, first, strict=True):
            if before is None:
                continue
            try:
                after = client.scrape()
            except ServerError as err:
                st.metrics_note = str(err)
                continue
            st.window_s = round(elapsed, 2)
            st.depths = activity(before, after, elapsed)
            _gauges(st, after)
            st.decoding = any(d.iterations > 0 for d in st.depths)
            if not (after.has_contract_counters() or after.trees):
                # The plugin answered /server_info, so it is loaded: it exports its counters
                # from the first decode iteration on.
                st.metrics_note = "no specctl_* counters yet: nothing decoded since start-up"
    finally:
        for c in clients:
            c.close()
    return statuses


def _read_state_and_scrape(st: ServerStatus, client: ServerClient) -> Scrape | None:
    from controller.bench.server_client import KeyRefused, ServerError

    try:
        state = client.state()
    except ServerError as err:
        st.error = str(err)
        st.key_refused = isinstance(err, KeyRefused)
        return None
    st.table = None if state.table is None else state.table.to_json()
    st.table_text = state.describe()
    st.source, st.version = state.source, state.version
    st.fingerprint = None if state.table is None else state.table.fingerprint
    st.captured_depths = list(state.captured_depths)
    st.captured_trees = [t.label for t in state.captured_trees]
    st.last_rejection, st.ranks = state.last_rejection, state.ranks
    st.active, st.inactive_reason = state.inactive_reason is None, state.inactive_reason
    st.off_path, st.off_path_text = state.off_path, state.describe_off_path()
    st.shapes, st.shapes_text = state.shapes, state.describe_shapes()
    try:
        return client.scrape()
    except ServerError as err:
        st.metrics_note = str(err)
        return None


def _gauges(st: ServerStatus, scrape: Scrape) -> None:
    g = scrape.gauges
    st.depth_in_use = g.get("sglang:spec_num_steps")
    st.running_requests = g.get("sglang:num_running_reqs")
    st.queued_requests = g.get("sglang:num_queue_reqs")


def _fmt(v: float | None, spec: str = ".1f") -> str:
    return "-" if v is None else format(v, spec)


def now_line(st: ServerStatus) -> str:
    """What the server does now. The gauges are trusted only while it decodes: SGLang publishes
    them every `decode_log_interval` iterations, so with nothing decoding they can be old."""
    gauges = (
        f"depth {_fmt(st.depth_in_use, '.0f')}, running {_fmt(st.running_requests, '.0f')}, "
        f"queued {_fmt(st.queued_requests, '.0f')}"
    )
    if st.decoding is None or st.decoding:
        return gauges
    quiet = f"no decode iterations in the last {st.window_s:g} s"
    if not st.gauges_busy:
        return f"idle ({quiet})"
    return (
        f"[yellow]stalled? {quiet}, yet SGLang's gauges last read {gauges} (a stuck "
        "scheduler, or gauges not refreshed since the last decode)[/yellow]"
    )


def server_panel(st: ServerStatus) -> Panel:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table

    if st.error:
        return Panel(f"[red]{st.error}[/red]", title=st.url, border_style="red")
    lines = [
        f"table      [bold]{st.table_text}[/bold]",
        f"source     {st.source}, version {st.version}"
        + ("" if st.fingerprint is None else f" #{st.fingerprint}")
        + f", {st.ranks} DP rank(s), "
        f"captured depths {st.captured_depths}"
        + (f", trees {st.captured_trees}" if st.captured_trees else ""),
        f"now        {now_line(st)}",
    ]
    if st.off_path_text:
        lines.insert(2, f"depth 0    {st.off_path_text}")
    if st.shapes_text:
        lines.insert(2, f"shapes     {st.shapes_text}")
    if st.inactive_reason:
        lines.insert(0, f"[red]inactive: {st.inactive_reason}[/red]")
    if st.last_rejection:
        lines.append(f"[yellow]last rejected push: {st.last_rejection}[/yellow]")
    body: list[Any] = ["\n".join(lines)]
    if st.depths:
        per = "per depth and tree" if any(d.shape for d in st.depths) else "per depth"
        t = Table(title=f"last {st.window_s:g} s, {per}", box=None, title_justify="left")
        for col in (
            "depth",
            "iters",
            "share",
            "batch",
            "accept",
            "step ms",
            "decode tok/s",
            "out tok/s",
        ):
            t.add_column(col, justify="right", no_wrap=True)
        for d in st.depths:
            t.add_row(
                d.label,
                f"{d.iterations:.0f}",
                f"{d.iteration_share:.0%}",
                _fmt(d.mean_batch),
                _fmt(d.accept_length, ".2f"),
                _fmt(d.step_ms, ".2f"),
                _fmt(d.decode_tok_per_s, ",.0f"),
                f"{d.output_tok_per_s:,.0f}",
            )
        body.append(t)
    if st.metrics_note:
        body.append(f"[dim]{st.metrics_note}[/dim]")
    border = "yellow" if st.inactive_reason else "green"
    return Panel(Group(*body), title=st.url, border_style=border)


def daemon_panel(daemon: dict[str, Any]) -> Panel:
    from rich.panel import Panel
    from rich.table import Table

    if daemon.get("error"):
        return Panel(
            f"[red]{daemon['error']}[/red]", title=f"daemon {daemon['url']}", border_style="red"
        )
    t = Table(box=None)
    t.add_column("target/group")
    t.add_column("metrics (daemon's own /metrics)")
    for owner, values in sorted(daemon["targets"].items()):
        t.add_row(owner, ", ".join(f"{k}={v:g}" for k, v in sorted(values.items())))
    return Panel(t, title=f"daemon {daemon['url']}", border_style="green")


@app.command("status")
def status(
    url: Annotated[list[str], typer.Option(help="A server to show (repeat for several).")],
    admin_key: Annotated[
        str | None,
        typer.Option(
            envvar=ADMIN_KEY_ENV,
            hidden=True,
            help="Accepted for scripts that pass it; status only reads, and reads take --api-key.",
        ),
    ] = None,
    api_key: Annotated[str | None, typer.Option(envvar=API_KEY_ENV, help=API_KEY_HELP)] = None,
    daemon_url: Annotated[
        str | None, typer.Option(help="The specctl daemon's metrics address (its metrics_port).")
    ] = None,
    window: Annotated[
        float,
        typer.Option(
            min=MIN_WINDOW_S,
            help="Seconds between the two /metrics scrapes (at least 0.5: shorter windows "
            "hold a handful of iterations, and their rates mean little).",
        ),
    ] = 3.0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON for scripts.")] = False,
) -> None:
    """Show a server's live table, depth in use and tok/s per depth.

    Exit status 1 if any server or the daemon could not be read, 2 on bad options or a key a
    server refused (401: the line names the key).

    \b
    Examples:
      specctl status --url http://127.0.0.1:30000
      specctl status --url http://127.0.0.1:30000 --api-key "$SGLANG_API_KEY"
      specctl status --url http://gpu1:30000 --url http://gpu2:30000 \\
          --daemon-url http://127.0.0.1:9465
      specctl status --url http://127.0.0.1:30000 --json | jq .servers[0].depths
    """
    from controller.daemon.config import url_problem

    for option, value in [("--url", u) for u in url] + [("--daemon-url", daemon_url)]:
        problem = None if value is None else url_problem(value)
        if problem is not None:
            raise typer.BadParameter(problem, param_hint=option)
    statuses = collect(url, admin_key, window, api_key)
    daemon = read_daemon(daemon_url) if daemon_url else None
    failed = any(s.error for s in statuses) or bool(daemon and daemon.get("error"))
    refused = [s for s in statuses if s.key_refused]
    if len(refused) == len(statuses) and daemon is None:
        for st in refused:  # nothing else to show: the one line that names the key
            typer.secho(f"error: {st.error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2)
    if as_json:
        doc = {"servers": [asdict(s) for s in statuses], "daemon": daemon}
        typer.echo(json.dumps(doc, indent=2))
    else:
        from rich.console import Console

        console = Console()
        for st in statuses:
            console.print(server_panel(st))
        if daemon is not None:
            console.print(daemon_panel(daemon))
    if refused:
        for st in refused:
            typer.secho(f"error: {st.error}", err=True, fg=typer.colors.RED)
        raise typer.Exit(2)
    if failed:
        raise typer.Exit(1)
