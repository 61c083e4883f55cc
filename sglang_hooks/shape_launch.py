"""What a server that steers draft trees needs on its SGLang command line (pure functions).

A list of shapes with a tree in it cannot use SGLang's adaptive states (they are chain-only,
docs/decisions/draft-shapes.md): SGLang starts statically at the listed shape that dominates
the others, since it sizes the KV reserve, the draft-input width and the logits buffer once from
its start-up flags, and every other shape is captured beside it. `plain` in such a list is
captured too, as SGLang's own depth 0 (a one-token verify at top-k 1, the draft extend skipped
while off); it keeps the start-up shape's KV reserve per request, which is sized once.
`shape_launch` checks a list and SGLang's arguments against what that needs and returns the
arguments to add, or raises ShapeError with one line naming the fix. A list of chains alone
(plain among them or not) keeps the depth path: it goes to `--depths`.

`specctl serve --shapes` applies these rules; the plugin's capture and switch
(sglang_hooks/shapes.py) then checks the server it finds against the same limits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sglang_hooks.draft_shape import (
    DraftShape,
    Shape,
    ShapeError,
    chain,
    dominating,
    kv_slots_per_request,
    label,
)
from sglang_hooks.launch import flag_value, has_flag

SHAPES_ENV = "SPECCTL_SHAPES"  # the list every node's plugin captures, as given
TREE_BACKEND = "fa3"
EAGLE_ALGORITHMS = ("EAGLE", "EAGLE3")
SIZE_FLAGS = {
    "--speculative-num-steps": lambda s: s.steps,
    "--speculative-eagle-topk": lambda s: s.topk,
    "--speculative-num-draft-tokens": lambda s: s.draft_tokens,
}
# Server features the plugin does not steer (sglang_hooks/hooks.py, plain_decode.py), and why a
# shape server in particular cannot run with them.
REFUSED_FEATURES = (
    ("--enable-two-batch-overlap", "a state swap discards its attention wrapper"),
    ("--enable-dp-attention", "the plugin steers no DP-attention server"),
    ("--enable-pdmux", "the plugin steers no PD-multiplexed server"),
    ("--enable-multi-layer-eagle", "multi-layer EAGLE keeps one draft state per layer"),
)


@dataclass(frozen=True)
class ShapeLaunch:
    start: DraftShape  # the shape SGLang starts at
    args: list[str]  # to append to the user's SGLang arguments
    env: dict[str, str]
    notes: list[str]


def shape_launch(shapes: Sequence[Shape], sglang_args: Sequence[str]) -> ShapeLaunch:
    """The start-up shape and the arguments that let a server capture every listed shape."""
    trees = [s for s in shapes if s is not None and not s.is_chain]
    if not trees:
        depths = sorted(0 if s is None else s.steps for s in shapes)
        raise ShapeError(f"shapes {_listed(shapes)} are chains only: pass --depths "
                         f"{','.join(map(str, depths))}, which keeps SGLang's own depth states")
    start = dominating(list(shapes))
    assert start is not None  # a tree is listed
    _check_args(shapes, start, sglang_args)
    args: list[str] = []
    for flag, size in SIZE_FLAGS.items():
        if not has_flag(sglang_args, flag):
            args += [flag, str(size(start))]
    notes = [f"SGLang starts at {start.label}, the listed shape with the widest top-k, draft "
             f"tokens and draft slots; each running request keeps "
             f"{kv_slots_per_request(start)} KV slots per decode at every tier "
             f"(a chain server up to the deepest listed chain keeps "
             f"{_chain_slots(shapes)})"]
    if any(s is None for s in shapes):
        notes.append(f"plain: off runs SGLang's depth 0 (a one-token verify, the draft extend "
                     f"skipped) and still keeps {start.label}'s KV reserve per request")
    if not has_flag(sglang_args, "--attention-backend"):
        args += ["--attention-backend", TREE_BACKEND]
        notes.append("added --attention-backend fa3: tree shapes run on FlashAttention 3 only")
    env = {SHAPES_ENV: ",".join(label(s) for s in shapes)}
    return ShapeLaunch(start=start, args=args, env=env, notes=notes)


def _check_args(shapes: Sequence[Shape], start: DraftShape, args: Sequence[str]) -> None:
    tree = next(s for s in shapes if s is not None and not s.is_chain)
    algorithm = flag_value(args, "--speculative-algorithm")
    if algorithm is None or algorithm.upper() not in EAGLE_ALGORITHMS:
        raise ShapeError(f"draft trees are EAGLE's: pass --speculative-algorithm EAGLE3 (or "
                         f"EAGLE) and its draft model, got {algorithm or 'none'}")
    for flag in ("--speculative-adaptive", "--speculative-adaptive-config"):
        if has_flag(args, flag):
            raise ShapeError(f"--shapes captures its own states; drop {flag}")
    for flag, size in SIZE_FLAGS.items():
        given = flag_value(args, flag)
        if given is not None and given != str(size(start)):
            raise ShapeError(f"{flag} {given}: SGLang must start at {start.label}, the shape "
                             f"that dominates the list; drop {flag} or pass {size(start)}")
    backend = flag_value(args, "--attention-backend")
    if backend is not None and backend != TREE_BACKEND:
        raise ShapeError(f"tree shapes run on FlashAttention 3 only (got --attention-backend "
                         f"{backend}); pass --attention-backend fa3")
    page = flag_value(args, "--page-size")
    if page is not None and page != "1":
        raise ShapeError(f"--page-size {page} with tree shape {tree.label}: paged trees reserve "
                         f"whole pages per branch, so the shapes' KV needs are not ordered by "
                         f"size; drop --page-size")
    for flag, why in REFUSED_FEATURES:
        if has_flag(args, flag):
            raise ShapeError(f"--shapes cannot run with {flag} ({why}); drop it")
    tp = flag_value(args, "--tp-size") or flag_value(args, "--tensor-parallel-size")
    if tp is not None and tp != "1":
        raise ShapeError(f"--shapes switches shapes on one GPU for now (--tp-size {tp}); drop "
                         f"it, or pass --depths to steer chains across the ranks")
    pp = flag_value(args, "--pp-size") or flag_value(args, "--pipeline-parallel-size")
    if pp is not None and pp != "1":
        raise ShapeError(f"--shapes cannot run with pipeline parallelism (--pp-size {pp}): only "
                         f"the last stage drafts; drop it")


def _chain_slots(shapes: Sequence[Shape]) -> int:
    deepest = max((s.steps for s in shapes if s is not None and s.is_chain), default=0)
    return kv_slots_per_request(chain(deepest))


def _listed(shapes: Sequence[Shape]) -> str:
    return ",".join(label(s) for s in shapes)
