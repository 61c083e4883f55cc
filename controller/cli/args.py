"""Option parsing shared by the commands: comma-separated integer lists."""

from __future__ import annotations

import typer


def parse_int_list(
    text: str, option: str, minimum: int, maximum: int | None = None
) -> tuple[int, ...]:
    """'4,1,2' -> (1, 2, 4): sorted, unique, each in [minimum, maximum].

    Raises typer.BadParameter naming `option` (typer prints it as one usage error, exit 2).
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    try:
        values = sorted({int(p) for p in parts})
    except ValueError:
        bad = next(p for p in parts if not _is_int(p))
        raise typer.BadParameter(
            f"{bad!r} is not an integer; expected comma-separated integers like 1,2,4",
            param_hint=option,
        ) from None
    if not values:
        raise typer.BadParameter(
            f"expected comma-separated integers like 1,2,4, got {text!r}", param_hint=option
        )
    wanted = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    for v in values:
        if v < minimum or (maximum is not None and v > maximum):
            raise typer.BadParameter(f"{v} is out of range: values must be {wanted}",
                                     param_hint=option)  # fmt: skip
    return tuple(values)


def _is_int(text: str) -> bool:
    try:
        int(text)
    except ValueError:
        return False
    return True

