"""Which SQLite store `specctl curves` and `specctl freeze` read when `--store` is not given.

Three commands write a store by default, each its own file:

- `specctl daemon --config controller.yaml` without `store.path`: the production default,
  `~/.local/state/specctl/specctl.sqlite`;
- `specctl daemon` without `--config` (the embedded simulated default): its `store.path`,
  `~/.local/state/specctl/simulated.sqlite`;
- `specctl demo`: `~/.local/state/specctl/demo.sqlite`, replaced by the next demo.

Without `--store` (or `--config`), the readers take the production store if there is one (a
real deployment's evidence comes first), else the newer of the two simulated ones (what was
run last), and say which they took.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

# The demo's own store: a demo run replaces the previous demo's, never a daemon's.
DEMO_STORE = Path("~/.local/state/specctl/demo.sqlite")


class StoreNotFound(RuntimeError):
    """No store where one was asked for or looked for; the message says how to make one."""


@dataclass(frozen=True)
class DefaultStore:
    path: Path
    written_by: str  # the command that writes it


def default_stores() -> list[DefaultStore]:
    """The stores the commands write by default, the production one first."""
    from controller.daemon.config import StoreConfig, load_config

    return [
        DefaultStore(StoreConfig.model_validate({}).resolved_path(),
                     "`specctl daemon --config ...` with the default store.path"),
        DefaultStore(load_config(None).store.resolved_path(),
                     "`specctl daemon` (the embedded default config)"),
        DefaultStore(DEMO_STORE.expanduser(), "`specctl demo`"),
    ]  # fmt: skip


def store_of_config(config: Path) -> Path:
    """The store.path of a controller.yaml (ConfigError if the file is not a valid config)."""
    from controller.daemon.config import load_config

    return load_config(config).store.resolved_path()


def find_store(given: Path | None = None, config: Path | None = None) -> tuple[Path, str | None]:
    """(the store to read, why that one when it was not given); StoreNotFound if none."""
    if given is not None:
        if not given.is_file():
            raise StoreNotFound(
                f"--store {given}: store not found; run `specctl daemon` (or `specctl demo`) to "
                "fill one, or pass the store.path of your controller.yaml"
            )
        return given, None
    if config is not None:
        path = store_of_config(config)
        if not path.is_file():
            raise StoreNotFound(
                f"--config {config}: its store {path} does not exist yet; run "
                f"`specctl daemon --config {config}` first"
            )
        return path, f"store.path of {config}"
    candidates = default_stores()
    production, simulated = candidates[0], candidates[1:]
    if production.path.is_file():
        return production.path, f"written by {production.written_by}"
    present = [s for s in simulated if s.path.is_file()]
    if present:
        newest = max(present, key=lambda s: s.path.stat().st_mtime)
        return newest.path, f"written by {newest.written_by}; the newest default store"
    looked = ", ".join(str(s.path) for s in candidates)
    raise StoreNotFound(
        f"no store found (looked for {looked}); run `specctl demo` or `specctl daemon` to fill "
        "one, or pass --store PATH (or --config controller.yaml)"
    )
