"""The daemon's configuration reference, generated from the models that validate it.

`python -m controller.daemon.config_reference > docs/daemon-config.md` writes every field of
`controller.yaml` (name, type with its bounds, default, description) as read from the pydantic
models in `controller/daemon/config.py`, and the learner's overrides from
`models.learner.LearnerConfig`. tests/test_config_reference.py fails when the checked-in file
differs from what this prints, so the reference cannot drift from the code.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from controller.daemon.config import ControllerConfig
from models.learner import LearnerConfig

# Fields typed as a plain mapping whose content another model validates at start-up.
VALIDATED_ELSEWHERE: dict[tuple[str, str], type[BaseModel]] = {
    ("ControllerConfig", "learner"): LearnerConfig,
}

TOP = ""  # the title of the file's top level, where field paths start

HEADER = """\
# Daemon configuration reference

Every field of `controller.yaml`, the file `specctl daemon --config` reads. Generated from the
models that validate it (`controller/daemon/config.py`; the `learner` section from
`models/learner.py`) by `python -m controller.daemon.config_reference > docs/daemon-config.md`;
tests/test_config_reference.py fails when this file and the models disagree. Do not edit it by
hand.

Unknown fields are refused, and so is a value outside its bounds: `specctl daemon` exits with
status 2 and one `error:` line naming each problem by its path (`targets[0].urll: unknown
field ...`). `controller.yaml` at the repository top shows every field with its default and a
comment; docs/daemon.md explains what the daemon does with them.
"""


BOUND_ATTRS = ("gt", "ge", "lt", "le", "min_length")


def _constraints(metadata: list[Any]) -> dict[str, Any]:
    """pydantic's constraint objects (annotated-types' Gt, Ge, Lt, Le, MinLen, each holding its
    bound under an attribute of that name) as {attribute: bound}."""
    found: dict[str, Any] = {}
    for m in metadata:
        if isinstance(m, FieldInfo):
            found.update(_constraints(list(m.metadata)))
        found.update({a: getattr(m, a) for a in BOUND_ATTRS if hasattr(m, a)})
    return found


def _bounds(metadata: list[Any]) -> list[str]:
    """`> 0.0`, `in [0.0, 0.5]`, `at least 1`."""
    c = _constraints(metadata)
    low = ("[", c["ge"]) if "ge" in c else ("(", c["gt"]) if "gt" in c else None
    high = (c["le"], "]") if "le" in c else (c["lt"], ")") if "lt" in c else None
    out = []
    if low and high:
        out.append(f"in {low[0]}{low[1]}, {high[0]}{high[1]}")
    elif low:
        out.append((">= " if low[0] == "[" else "> ") + str(low[1]))
    elif high:
        out.append(("<= " if high[1] == "]" else "< ") + str(high[0]))
    if "min_length" in c:
        out.append(f"at least {c['min_length']}")
    return out


def _type_name(annotation: Any) -> str:
    """A YAML-minded name of a field's type: `float > 0`, `wall \\| simulated`, `str or null`."""
    origin = get_origin(annotation)
    if origin is Annotated:
        base, *extra = get_args(annotation)
        bounds = _bounds(extra)
        return " ".join([_type_name(base), *bounds]) if bounds else _type_name(base)
    if origin in (Union, types.UnionType):
        args = get_args(annotation)
        named = [_type_name(a) for a in args if a is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin is Literal:
        return " \\| ".join(f"`{v}`" for v in get_args(annotation))
    if origin is list:
        (item,) = get_args(annotation)
        return f"list of {_type_name(item)}s"
    if origin is dict:
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    if annotation is Any:
        return "any"
    return getattr(annotation, "__name__", str(annotation))


def _yaml_value(value: Any) -> str:
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if isinstance(value, str):
        return f'`"{value}"`' if value == "" else f"`{value}`"
    if isinstance(value, dict) and not value:
        return "`{}`"
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    return f"`{value}`"


def _field_type(info: FieldInfo) -> str:
    """The annotation's name with the bounds pydantic moved off it into the field."""
    bounds = _bounds(list(info.metadata))
    name = _type_name(info.annotation)
    if get_origin(info.annotation) is list and bounds:  # a length bound counts items
        return f"{name} ({', '.join(bounds)})"
    return " ".join([name, *bounds])


def _default(info: FieldInfo) -> str:
    if info.default_factory is not None:
        return _yaml_value(info.default_factory())  # type: ignore[call-arg]
    if info.default is PydanticUndefined:
        return "required"
    return _yaml_value(info.default)


def _nested_models(annotation: Any) -> Iterator[type[BaseModel]]:
    """The models a field's value holds (a section, a list of them, an optional one)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
        return
    for arg in get_args(annotation):
        yield from _nested_models(arg)


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _section(
    title: str, model: type[BaseModel], sections: list[tuple[str, type[BaseModel]]]
) -> str:
    """One table for `model`; the models its fields hold are added to `sections`."""
    lines = ["## Top level" if title == TOP else f"## `{title}`", ""]
    doc = (model.__doc__ or "").strip()
    if doc and not doc.startswith(("A base class", "Usage docs")):
        lines += [_cell(doc.splitlines()[0]), ""]
    lines += ["| field | type | default | description |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        path = name if title == TOP else f"{title}.{name}"
        description = info.description or ""
        for nested in _nested_models(info.annotation):
            is_list = get_origin(info.annotation) is list
            sub = f"{path}[]" if is_list else path
            sections.append((sub, nested))
            description = (description + f" (section `{sub}` below)").strip()
        elsewhere = VALIDATED_ELSEWHERE.get((model.__name__, name))
        if elsewhere is not None:
            sections.append((path, elsewhere))
            description += f" (section `{path}` below)"
        lines.append(
            f"| `{name}` | {_field_type(info)} | {_default(info)} | {_cell(description)} |"
        )
    return "\n".join(lines) + "\n"


def render_reference() -> str:
    """The whole reference, as docs/daemon-config.md holds it."""
    parts = [HEADER]

    def visit(title: str, model: type[BaseModel]) -> None:
        nested: list[tuple[str, type[BaseModel]]] = []
        parts.append(_section(title, model, nested))
        for sub_title, sub_model in nested:  # each section right after the one holding it
            visit(sub_title, sub_model)

    visit(TOP, ControllerConfig)
    return "\n".join(parts)


def main() -> int:
    sys.stdout.write(render_reference())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
