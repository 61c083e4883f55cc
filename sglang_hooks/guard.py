"""Version guard: decide, before anything is patched, whether this SGLang can be hooked.

Every symbol an adapter hooks or reads is checked in SGLang's *source* with `ast` (class,
method, leading parameter names, async-ness, dataclass fields), so the check imports nothing
heavy, runs the same way in every SGLang process, and can be pointed at an unpacked release
that is not installed (the tests check 0.5.17 and 0.5.23 this way). On a mismatch the plugin
logs one line naming the symbol and the supported versions and registers nothing.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from sglang_hooks.adapters import ADAPTERS, Adapter, SymbolSpec

SUPPORTED = "0.5.17 to 0.5.23"
MIN_VERSION, MAX_VERSION = (0, 5, 17), (0, 5, 23)


@dataclass(frozen=True)
class GuardResult:
    adapter: Adapter | None
    version: str
    reason: str | None  # why nothing is registered (None when adapter is set)


def sglang_root() -> Path | None:
    """The installed `sglang` package folder, found without importing it."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def read_version(root: Path) -> str:
    text = (root / "_version.py").read_text(encoding="utf-8")
    match = re.search(r"""^__version__\s*=.*?['"]([^'"]+)['"]""", text, re.MULTILINE)
    if match is None:
        raise ValueError(f"no __version__ in {root / '_version.py'}")
    return match.group(1)


def parse_version(text: str) -> tuple[int, int, int] | None:
    match = re.match(r"(\d+)\.(\d+)\.(\d+)", text)
    return None if match is None else (int(match[1]), int(match[2]), int(match[3]))


@lru_cache(maxsize=32)
def _parse(path: Path) -> ast.Module:
    return ast.parse(path.read_text(encoding="utf-8"), filename=str(path))


def _module_file(root: Path, module: str) -> Path:
    parts = module.split(".")
    assert parts[0] == "sglang", module
    base = root.joinpath(*parts[1:])
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def check_symbol(root: Path, sym: SymbolSpec) -> str | None:
    """None if `sym` exists as declared, else a sentence saying what differs."""
    path = _module_file(root, sym.module)
    if not path.is_file():
        return f"{sym.module} is missing ({path.name} not found)"
    tree = _parse(path)
    if not sym.cls:
        return _check_function(tree, sym)
    cls = next(
        (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == sym.cls),
        None,
    )
    if cls is None:
        return f"class {sym.module}.{sym.cls} is missing"
    if sym.attribute:
        names = {
            n.target.id
            for n in cls.body
            if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
        }
        return None if sym.name in names else f"field {sym.where} is missing"
    if sym.instance:
        return None if sym.name in _init_assigned(cls) else f"attribute {sym.where} is missing"
    fn = next(
        (
            n
            for n in cls.body
            if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) and n.name == sym.name
        ),
        None,
    )
    if fn is None:
        return f"method {sym.where} is missing"
    if isinstance(fn, ast.AsyncFunctionDef) != sym.is_async:
        return f"{sym.where} is {'' if sym.is_async else 'not '}expected to be async"
    args = [a.arg for a in (*fn.args.posonlyargs, *fn.args.args)][1:]
    want = list(sym.params)
    if args[: len(want)] != want:
        return f"{sym.where}{_sig(args)} no longer starts with {_sig(want)}"
    return _check_reads(fn, sym)


def _check_function(tree: ast.Module, sym: SymbolSpec) -> str | None:
    fn = next((n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
               and n.name == sym.name), None)
    if fn is None:
        return f"function {sym.where} is missing"
    names = {a.arg for a in (*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs)}
    missing = [p for p in sym.params if p not in names]
    if missing:
        return f"function {sym.where} has no parameter {', '.join(missing)}"
    return _check_reads(fn, sym)


def _check_reads(fn: ast.FunctionDef | ast.AsyncFunctionDef, sym: SymbolSpec) -> str | None:
    """Whether the body still reads what the plugin relies on (compared as `ast.unparse`
    writes it, so formatting and comments do not matter)."""
    if not sym.reads or sym.reads in ast.unparse(fn):
        return None
    return f"{sym.where} no longer reads {sym.reads}"


def _init_assigned(cls: ast.ClassDef) -> set[str]:
    """Names `__init__` assigns on self (`self.x = ...`, `self.x: T = ...`)."""
    init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"),
                None)
    if init is None:
        return set()
    names = set()
    for node in ast.walk(init):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                    and t.value.id == "self":
                names.add(t.attr)
    return names


def _sig(args: list[str]) -> str:
    return "(self, " + ", ".join(args) + ")" if args else "(self)"


def check_adapter(root: Path, adapter: Adapter, shapes: bool = True) -> str | None:
    for sym in adapter.symbols(shapes):
        problem = check_symbol(root, sym)
        if problem is not None:
            return problem
    return None


def evaluate(root: Path | None = None, version: str | None = None,
             shapes: bool | None = None) -> GuardResult:
    """Pick the adapter for the SGLang at `root` (default: the installed one). `shapes`
    (default: whether SPECCTL_SHAPES lists shapes): check what a shape server needs too."""
    if shapes is None:
        from sglang_hooks import settings

        shapes = bool(settings.SHAPES.get())
    root = sglang_root() if root is None else root
    if root is None:
        return GuardResult(None, "", "SGLang is not installed")
    try:
        version = read_version(root) if version is None else version
    except (OSError, ValueError) as err:
        return GuardResult(None, "", f"cannot read SGLang's version: {err}")
    parsed = parse_version(version)
    if parsed is None or not MIN_VERSION <= parsed <= MAX_VERSION:
        return GuardResult(
            None, version, f"SGLang {version} is not supported (supported: {SUPPORTED})"
        )
    problems = []
    for adapter in ADAPTERS:
        if not adapter.min_version <= parsed <= adapter.max_version:
            continue
        problem = check_adapter(root, adapter, shapes)
        if problem is None:
            return GuardResult(adapter, version, None)
        problems.append(problem)
    return GuardResult(
        None,
        version,
        f"SGLang {version}: {problems[0] if problems else 'no adapter'} "
        f"(supported: {SUPPORTED})",
    )
