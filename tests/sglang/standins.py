"""Import-time stand-ins for the GPU-only packages that block `import sglang` on a CPU box.

Only two packages are replaced, and only because no CPU build of them can be installed
beside CPU torch:

- `triton`: SGLang ships its own stand-in (`sglang/_platform_stubs.py`, used on macOS where
  triton does not exist). We load that file by path (importing it through the `sglang`
  package would import triton first) and run its installer with the platform checks
  pointed at "macOS/MPS" for the duration of the call, so SGLang's code, not ours, decides
  what the stand-in contains.
- `torchvision`: the published torchvision wheel is tied to CUDA torch. SGLang imports it
  only through multimodal helpers that the classes under test never call, so an empty module with a
  version string is enough; transformers is told it is absent so it does not probe it.

Nothing here stands in for SGLang itself: every SGLang class the tests use is the real one.
"""

from __future__ import annotations

import importlib.util
import platform
import sys
import types
from pathlib import Path
from unittest import mock


def _sglang_root() -> Path:
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("sglang is not installed in this interpreter (see scripts/test.sh)")
    return Path(next(iter(spec.submodule_search_locations)))


def install_triton_standin() -> None:
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return
    path = _sglang_root() / "_platform_stubs.py"
    spec = importlib.util.spec_from_file_location("_sglang_platform_stubs", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    import torch

    with (
        mock.patch.object(sys, "platform", "darwin"),
        mock.patch.object(platform, "machine", lambda: "arm64"),
        mock.patch.object(torch.backends.mps, "is_available", lambda: True),
    ):
        module.install_platform_stubs()
    if "triton" not in sys.modules:
        raise RuntimeError(f"{path}: install_platform_stubs() did not provide triton")


class _Placeholder:
    """Any attribute of it is itself: `InterpolationMode.BICUBIC` as a default value works."""

    def __getattr__(self, name: str) -> _Placeholder:
        return self

    def __call__(self, *args: object, **kwargs: object) -> _Placeholder:
        return self


class _PlaceholderModule(types.ModuleType):
    """A package whose names exist but do nothing; SGLang only references them at import."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.__path__: list[str] = []
        self.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)

    def __getattr__(self, name: str) -> object:
        if name.startswith("__"):
            raise AttributeError(name)
        return _Placeholder()


def install_torchvision_standin() -> None:
    if "torchvision" in sys.modules:
        return
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional",
                 "torchvision.io"):
        sys.modules[name] = _PlaceholderModule(name)
    sys.modules["torchvision"].__version__ = "0.0.0+standin"  # type: ignore[attr-defined]
    import transformers.utils as tu
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available = lambda: False  # type: ignore[assignment]
    tu.is_torchvision_available = lambda: False  # type: ignore[assignment]


def install() -> None:
    install_triton_standin()
    install_torchvision_standin()
