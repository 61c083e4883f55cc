"""A transient progress bar around long simulator work, and the console it printed on."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from rich.console import Console

T = TypeVar("T")


def with_progress(label: str, total: int,
                  work: Callable[[Callable[[], None]], T]) -> tuple[Console, T]:
    """Run `work(advance)` under a bar of `total` steps; the bar goes when it ends."""
    # rich is imported here, not at the top: `specctl --help` starts without it
    from rich.console import Console
    from rich.progress import Progress

    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(label, total=total)
        result = work(lambda: progress.advance(task))
    return console, result
