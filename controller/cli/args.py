"""Option parsing shared by the commands: comma-separated number lists, output paths, and the
one-line `error:` every command exits with.

Light on purpose (typer and the standard library only): every command module imports it at
start-up, `specctl --help` included.
"""

from __future__ import annotations

import os
from pathlib import Path

import typer

PLOT_SUFFIXES = (".png", ".svg", ".pdf")

# The admin key's environment variable; controller.bench.server_client reads the same one
# (not imported from there: that module loads httpx, too heavy for `--help`).
ADMIN_KEY_ENV = "SPECCTL_ADMIN_KEY"
# The API key's, as controller.bench.server_client and the plugin's smoke check read it.
API_KEY_ENV = "SPECCTL_API_KEY"
API_KEY_HELP = (
    "The server's --api-key, sent as 'Authorization: Bearer KEY' on every request but the "
    "admin ones (which carry --admin-key)."
)


def fail(message: str) -> typer.Exit:
    """Print `error: message` as one line on stderr; returns the Exit to raise (status 2)."""
    typer.secho(f"error: {message}", err=True, fg=typer.colors.RED)
    return typer.Exit(2)


def _items(text: str, option: str, kind: str, example: str) -> list[str]:
    """The comma-separated items of `text`; an empty one ('1,,4', '1,4,') is refused."""
    parts = [p.strip() for p in text.split(",")]
    if not any(parts):
        raise typer.BadParameter(
            f"expected comma-separated {kind} like {example}, got {text!r}", param_hint=option
        )
    if not all(parts):
        raise typer.BadParameter(
            f"{text!r} has an empty item (two commas in a row, or one at an end); "
            f"write it like {example}",
            param_hint=option,
        )
    return parts


def parse_int_list(
    text: str, option: str, minimum: int, maximum: int | None = None
) -> tuple[int, ...]:
    """'4,1,2' -> (1, 2, 4): sorted, unique, each in [minimum, maximum].

    Raises typer.BadParameter naming `option` (printed as one `error:` line, exit 2).
    """
    parts = _items(text, option, "integers", "1,2,4")
    values = []
    for p in parts:
        try:
            values.append(int(p))
        except ValueError:
            raise typer.BadParameter(
                f"{p!r} is not an integer; expected comma-separated integers like 1,2,4",
                param_hint=option,
            ) from None
    wanted = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
    for v in values:
        if v < minimum or (maximum is not None and v > maximum):
            raise typer.BadParameter(f"{v} is out of range: values must be {wanted}",
                                     param_hint=option)  # fmt: skip
    return tuple(sorted(set(values)))


def parse_length(text: str, option: str) -> int | tuple[int, int]:
    """'128' -> 128; '64:192' -> (64, 192), lengths drawn evenly over that range.

    Raises typer.BadParameter naming `option` (printed as one `error:` line, exit 2)."""
    parts = [p.strip() for p in text.split(":")]
    try:
        values = [int(p) for p in parts]
    except ValueError:
        raise typer.BadParameter(
            f"{text!r}: give a token count N or a range LOW:HIGH, like 128 or 64:192",
            param_hint=option,
        ) from None
    if len(values) > 2 or min(values) < 1:
        raise typer.BadParameter(
            f"{text!r}: give a token count N >= 1 or a range LOW:HIGH, like 128 or 64:192",
            param_hint=option,
        )
    if len(values) == 1:
        return values[0]
    low, high = values
    if low > high:
        raise typer.BadParameter(f"{text!r}: LOW must not exceed HIGH, like 64:192",
                                 param_hint=option)  # fmt: skip
    return (low, high) if low < high else low


def parse_positive_list(text: str, option: str) -> tuple[float, ...]:
    """'4,0.5,2' -> (0.5, 2.0, 4.0): sorted, unique, each a finite number > 0."""
    values = []
    for p in _items(text, option, "numbers", "0.5,1,2"):
        try:
            v = float(p)
        except ValueError:
            raise typer.BadParameter(
                f"{p!r} is not a number; expected comma-separated numbers like 0.5,1,2",
                param_hint=option,
            ) from None
        if not 0 < v < float("inf"):
            raise typer.BadParameter(f"{p} is out of range: values must be > 0",
                                     param_hint=option)  # fmt: skip
        values.append(v)
    return tuple(sorted(set(values)))


def output_file_problem(path: Path, option: str) -> str | None:
    """Why a file cannot be written at `path` (checked before any long work), or None.

    The folder must exist already: a typo in it should not create a tree of folders."""
    if path.is_dir():
        return f"{option} {path}: is a folder; give a file name (e.g. {path / 'policy.yaml'})"
    parent = path.parent
    if not parent.is_dir():
        return f"{option} {path}: folder {parent} does not exist; create it or pick another path"
    if not os.access(parent, os.W_OK):
        return f"{option} {path}: folder {parent} is not writable; pick another path"
    return None


def plot_path_problem(path: Path, option: str = "--plot") -> str | None:
    """Why a figure cannot be written to `path` (checked before any work), or None."""
    if path.suffix.lower() not in PLOT_SUFFIXES:
        return (
            f"{option} {path}: unsupported format {path.suffix or '(no suffix)'!r}; "
            f"use one of {', '.join(PLOT_SUFFIXES)}"
        )
    return output_file_problem(path, option)


def write_problem(folder: Path, option: str, given: Path) -> str | None:
    """Why files cannot be written into `folder` (None when they can), as one line naming
    `option` and the value the user gave."""
    try:
        probe = folder / ".specctl-write-check"
        probe.touch()
        probe.unlink()
    except OSError as err:
        return f"{option} {given}: cannot write there ({err.strerror or err}); pick another folder"
    return None


def parse_headers(items: list[str] | None, option: str = "--header") -> dict[str, str]:
    """['X-Route: a', 'K=V'] -> {'X-Route': 'a', 'K': 'V'}: NAME:VALUE, or NAME=VALUE as
    `sglang.bench_serving --header` writes it. Raises typer.BadParameter naming `option`."""
    out: dict[str, str] = {}
    for item in items or ():
        colon, equals = item.find(":"), item.find("=")
        cuts = [i for i in (colon, equals) if i > 0]
        if not cuts:
            raise typer.BadParameter(
                f"{item!r}: expected NAME:VALUE (or NAME=VALUE), e.g. X-Routing-Key:abc",
                param_hint=option,
            )
        cut = min(cuts)
        name, value = item[:cut].strip(), item[cut + 1 :].strip()
        if not name or any(c.isspace() for c in name):
            raise typer.BadParameter(
                f"{item!r}: the header name must be one word before ':', e.g. X-Routing-Key:abc",
                param_hint=option,
            )
        if name.lower() == "authorization":
            raise typer.BadParameter(
                f"{item!r}: give the server's key with --api-key (it goes on every request but "
                "the admin ones, which get --admin-key)",
                param_hint=option,
            )
        out[name] = value
    return out
