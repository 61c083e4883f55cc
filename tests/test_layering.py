"""The import layering of the four packages, read from the source with `ast` (nothing imported).

README.md ("Layers") states the rule: each unit below may import only the units it lists (and
itself); every import counts, those inside functions and under `TYPE_CHECKING` included, since
each is still a dependency of the module. On top of the layers, no import cycle of any length,
and the daemon's stages import only the stages before them in the data flow.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("sglang_hooks", "sims", "models", "controller")

CONTRACT = "sglang_hooks.contract"
SHAPES = "sglang_hooks.draft_shape"  # the shape notation the contract's tree tiers use
PLUGIN = "sglang_hooks"
SIMS = "sims"
MODELS = "models"
DAEMON = "controller.daemon"
BENCH = "controller.bench"
EVALUATION = "controller.evaluation"
CLI = "controller.cli"
CONTROLLER = "controller"  # the package itself: holds no code, may import nothing

# unit -> the units it may import besides itself; a module belongs to its longest prefix here.
MAY_IMPORT: dict[str, set[str]] = {
    SHAPES: set(),
    CONTRACT: {SHAPES},
    PLUGIN: {CONTRACT, SHAPES},
    SIMS: {CONTRACT, SHAPES},
    MODELS: {CONTRACT, SHAPES},
    DAEMON: {CONTRACT, SHAPES, MODELS, SIMS},
    BENCH: {CONTRACT, SHAPES, DAEMON},
    EVALUATION: {CONTRACT, SHAPES, MODELS, SIMS, DAEMON},
    CLI: {CONTRACT, SHAPES, PLUGIN, MODELS, SIMS, DAEMON, BENCH, EVALUATION},
    CONTROLLER: set(),
}

# The daemon's modules in the order data flows through them: each imports only earlier ones,
# so each can be tested with nothing after it.
DAEMON_FLOW = (
    "transport",
    "config",
    "config_reference",
    "own_metrics",
    "policy_file",
    "frozen",
    "scrape",
    "sources",
    "store",
    "bench_seed",
    "model",
    "takeover",
    "reaction",
    "guardrails",
    "push_gate",
    "push",
    "handback",
    "loop",
    "runner",
)

# Third-party packages the SGLang side must never load: it runs inside SGLang's scheduler.
PLUGIN_FORBIDDEN = {"typer", "rich", "click"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    return {
        _module_name(p): p
        for top in PACKAGES
        for p in sorted((ROOT / top).rglob("*.py"))
        if "__pycache__" not in p.parts
    }


MODULES = _sources()


def _imported_names(name: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every module name `name` imports (absolute), with the line of the import."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = name.split(".")
                if not is_package:
                    package.pop()
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, base] if base else package)
            for alias in node.names:
                # `from a import b` imports the module a.b when there is one, else names in a.
                full = f"{base}.{alias.name}"
                yield (full if full in MODULES else base), node.lineno


def _project_module(imported: str) -> str | None:
    """The project module an import loads (its longest known prefix), or None if external."""
    parts = imported.split(".")
    while parts:
        candidate = ".".join(parts)
        if candidate in MODULES:
            return candidate
        parts.pop()
    return None


def _unit(module: str) -> str:
    return max((u for u in MAY_IMPORT if module == u or module.startswith(u + ".")), key=len)


def _edges() -> dict[str, dict[str, int]]:
    graph: dict[str, dict[str, int]] = {m: {} for m in MODULES}
    for name, path in MODULES.items():
        for imported, line in _imported_names(name, path):
            target = _project_module(imported)
            if target is not None and target != name:
                graph[name].setdefault(target, line)
    return graph


GRAPH = _edges()


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def test_every_module_belongs_to_a_unit() -> None:
    assert set(MODULES) >= {CONTRACT, PLUGIN, SIMS, MODELS}, "package sources not found"
    orphans = [m for m in MODULES if _unit(m) == CONTROLLER and m != CONTROLLER]
    assert not orphans, (
        f"{orphans}: controller/ holds only the packages daemon, bench, evaluation and cli; "
        "move the module into one of them (or add a unit to MAY_IMPORT and to README.md, Layers)"
    )


def test_no_module_imports_from_a_unit_above_it() -> None:
    problems = [
        f"{_where(src, line)}: {src} ({_unit(src)}) imports {dst} ({_unit(dst)})"
        for src, targets in GRAPH.items()
        for dst, line in targets.items()
        if _unit(dst) != _unit(src) and _unit(dst) not in MAY_IMPORT[_unit(src)]
    ]
    assert not problems, "imports against the layering (README.md, Layers):\n" + "\n".join(
        problems
    )


def _cycles() -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles()
    assert not cycles, "modules that import each other (directly or through others):\n" + (
        "\n".join(
            " <-> ".join(c)
            + ": "
            + ", ".join(_where(a, GRAPH[a][b]) for a in c for b in c if b in GRAPH[a])
            for c in cycles
        )
    )


def test_daemon_stages_import_only_earlier_stages() -> None:
    stages = [m for m in MODULES if _unit(m) == DAEMON and m != DAEMON]
    unlisted = sorted(set(stages) - {f"{DAEMON}.{s}" for s in DAEMON_FLOW})
    assert not unlisted, f"{unlisted}: add each to DAEMON_FLOW where it sits in the data flow"
    rank = {f"{DAEMON}.{s}": i for i, s in enumerate(DAEMON_FLOW)}
    late = [
        f"{_where(src, line)}: {src} imports {dst}, a later stage"
        for src in stages
        for dst, line in GRAPH[src].items()
        if dst in rank and rank[dst] >= rank[src]
    ]
    assert not late, "\n".join(late)


@pytest.mark.parametrize(
    "module", sorted(m for m in MODULES if _unit(m) in (CONTRACT, PLUGIN)), ids=str
)
def test_sglang_side_loads_no_cli_framework(module: str) -> None:
    loaded = {
        imported.split(".")[0]
        for imported, _ in _imported_names(module, MODULES[module])
    }
    assert not loaded & PLUGIN_FORBIDDEN, f"{module} imports {sorted(loaded & PLUGIN_FORBIDDEN)}"


@pytest.mark.parametrize("module", [CONTRACT, SHAPES])
def test_contract_imports_only_the_standard_library(module: str) -> None:
    imported = {name for name, _ in _imported_names(module, MODULES[module])}
    tops = {name.split(".")[0] for name in imported if _project_module(name) != SHAPES}
    outside = sorted(tops - set(sys.stdlib_module_names) - {"__future__"})
    assert not outside, f"{module} imports {outside}: it is loaded inside SGLang's scheduler"
