"""Session set-up for the tests that run against the real SGLang 0.5.23 wheel (CPU only).

Run by scripts/test.sh with .venv-sglang/bin/python (see there for the install). In the
main .venv, where SGLang is not installed, this folder is skipped as a whole.

Before anything imports prometheus_client, PROMETHEUS_MULTIPROC_DIR points at a fresh folder
(the multiprocess mode SGLang's servers use). Then the GPU-only imports get stand-ins
(standins.py: triton through SGLang's own `_platform_stubs`, an empty torchvision), and the
plugin is loaded once through SGLang's real `load_plugins()` and the installed entry point,
so every test in this session sees the classes exactly as a server process would. Those
patches cannot be undone, which is why this folder runs in its own interpreter.
"""

from __future__ import annotations

import importlib.metadata
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent


def _sglang_installed() -> bool:
    # By distribution, not find_spec: this folder itself is named "sglang".
    try:
        importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


if not _sglang_installed():
    collect_ignore_glob = ["test_real_*.py"]  # the pure-Python tests here still run
else:
    os.environ.setdefault("PROMETHEUS_MULTIPROC_DIR", tempfile.mkdtemp(prefix="specctl-prom-"))
    if "prometheus_client.values" in sys.modules:
        raise RuntimeError(
            "prometheus_client was imported before tests/sglang/conftest.py could switch it to "
            "multiprocess mode; run this folder alone with --confcutdir=tests/sglang "
            "(scripts/test.sh does)"
        )
    os.environ["SGLANG_PLUGINS"] = "specctl"
    sys.path.insert(0, str(HERE))
    import standins

    standins.install()


@pytest.fixture(scope="session")
def plugin_loaded() -> bool:
    """SGLang's real loader ran the plugin; its hooks reach HookRegistry as each test imports
    the module they patch (sglang_hooks/deferred.py)."""
    from sglang.srt.plugins import load_plugins

    from sglang_hooks import hooks, plugin

    load_plugins()
    return hooks.ADAPTER is not None and plugin.DEFERRED is not None


@pytest.fixture
def runtime(plugin_loaded: bool):  # type: ignore[no-untyped-def]
    """A fresh plugin runtime for one test (the hooks read the module global at call time),
    running depth 0 as a scheduler of this SGLang (0.5.23) does once it steers."""
    from sglang_hooks import hooks
    from sglang_hooks.gpu_timer import HostIntervalTimer
    from sglang_hooks.runtime import SchedulerRuntime

    assert plugin_loaded, "the specctl plugin registered no hooks"
    previous = hooks.RUNTIME
    hooks.RUNTIME = SchedulerRuntime(timer=HostIntervalTimer())
    hooks.RUNTIME.use_off_path(hooks.OFF_PATH, hooks.FEATURES)
    yield hooks.RUNTIME
    hooks.RUNTIME = previous


@pytest.fixture(scope="session")
def sglang17_root() -> Path:
    root = os.environ.get("SPECCTL_SGLANG17_SRC")
    if not root or not (Path(root) / "_version.py").is_file():
        pytest.fail("SPECCTL_SGLANG17_SRC must point at the unpacked sglang 0.5.17 package "
                    "(scripts/test.sh downloads it)")
    return Path(root)


@pytest.fixture
def fresh_settings(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """Each test reads the environment it sets, and sees its own bad-value lines: every
    variable the plugin declares (settings.py) unset, its bad-value memory empty."""
    from sglang_hooks import settings

    monkeypatch.setattr(settings, "_reported", set())
    for setting in vars(settings.Environment).values():
        if isinstance(setting, settings.Setting):
            monkeypatch.delenv(setting.name, raising=False)
    return monkeypatch


@pytest.fixture
def tp_store() -> Iterator[Any]:
    """A TCPStore master on a free loopback port and a client factory, as every rank of a
    process group sees torch.distributed's default store."""
    import datetime
    import socket

    from torch.distributed import PrefixStore, TCPStore

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    timeout = datetime.timedelta(seconds=10)
    master = TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timeout)

    def client() -> Any:
        return PrefixStore("default_pg", TCPStore("127.0.0.1", port, is_master=False,
                                                  timeout=timeout))
    yield client
    del master
