"""Entry point of the `specctl` console script."""

from __future__ import annotations

import importlib

from controller.cli_app import app

# One module per command (group); importing a module registers its commands on `app`.
COMMAND_MODULES = (
    "sims.cli",
    "sims.fit.cli",
    "controller.bench_cli",
    "controller.status_cli",
    "controller.curves_cli",
    "controller.freeze_cli",
    "sglang_hooks.serve_cli",
    "controller.daemon_cli",
    "controller.evaluate_cli",
    "controller.demo_cli",
)


def main() -> None:
    for name in COMMAND_MODULES:
        importlib.import_module(name)
    app()


if __name__ == "__main__":
    main()
