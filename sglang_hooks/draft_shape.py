"""Draft shapes as SGLang's EAGLE flags take them: steps x topk x draft tokens.

A chain is topk 1 with steps + 1 draft tokens (specctl's depth d is the chain d x 1 x d+1); a
tree has topk above 1 and verifies `draft_tokens` positions per request per step, picked from
the topk + (steps - 1) x topk^2 candidates the drafting scores. `plain` is no speculation.

Standard library only: the policy contract (a tier may name a tree), the GPU harness
(benchmarks/gpu/draft_shapes.py) and the simulator's profiles read shapes with it.
"""

from __future__ import annotations

from dataclasses import dataclass

PLAIN = "plain"


class ShapeError(ValueError):
    """A shape or shape list that cannot be run; the message names the bad item and the fix."""


@dataclass(frozen=True)
class DraftShape:
    steps: int
    topk: int
    draft_tokens: int

    @property
    def label(self) -> str:
        return f"{self.steps}x{self.topk}x{self.draft_tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1

    def sglang_flags(self) -> list[str]:
        return ["--speculative-algorithm", "EAGLE3",
                "--speculative-num-steps", str(self.steps),
                "--speculative-eagle-topk", str(self.topk),
                "--speculative-num-draft-tokens", str(self.draft_tokens)]  # fmt: skip


Shape = DraftShape | None  # None: the plain server, or a tier's drafting off


def label(shape: Shape) -> str:
    return PLAIN if shape is None else shape.label


def chain(depth: int) -> Shape:
    """specctl's depth as a shape: `dx1x(d+1)`, and depth 0 off."""
    return None if depth == 0 else DraftShape(depth, 1, depth + 1)


def depths_and_trees(shapes: list[Shape]) -> tuple[list[int], list[DraftShape]]:
    """What a server capturing `shapes` names in a table, in list order: the depths (a chain's
    steps, plain's 0, as off) and the trees."""
    depths = [0 if s is None else s.steps for s in shapes if s is None or s.is_chain]
    return depths, [s for s in shapes if s is not None and not s.is_chain]


def dominating(shapes: list[Shape]) -> DraftShape | None:
    """The listed shape SGLang must start at so that every listed shape fits what it sizes once:
    the largest top-k (draft-input width), draft tokens (verify width, logits buffer) and steps x
    top-k (draft slots), the KV reserve per request being `2 * max(steps x topk, draft)`. None
    when nothing drafts. Raises ShapeError naming the shape to add when no listed one is largest
    in all three."""
    drafting = [s for s in shapes if s is not None]
    if not drafting:
        return None
    topk = max(s.topk for s in drafting)
    draft = max(s.draft_tokens for s in drafting)
    slots = max(s.steps * s.topk for s in drafting)
    for s in drafting:
        if (s.topk, s.draft_tokens, s.steps * s.topk) == (topk, draft, slots):
            return s
    listed = ",".join(label(s) for s in shapes)
    raise ShapeError(f"shapes {listed}: no listed shape has the largest top-k ({topk}), draft "
                     f"tokens ({draft}) and steps x top-k ({slots}) that SGLang sizes its "
                     f"buffers and KV reserve by; add {_covering(topk, draft, slots).label}")


def _covering(topk: int, draft: int, slots: int) -> DraftShape:
    # A tree (the chains alone always have a deepest member): the fewest steps that give
    # steps x topk >= slots and score enough candidates for `draft` tokens.
    steps = -(-slots // topk)
    while topk + (steps - 1) * topk * topk + 1 < draft:
        steps += 1
    return DraftShape(steps, topk, draft)


def kv_slots_per_request(shape: Shape) -> int:
    """KV slots SGLang keeps per running request for one decode at this shape (page size 1):
    twice the larger of the draft slots and the verify width."""
    return 0 if shape is None else 2 * max(shape.steps * shape.topk, shape.draft_tokens)


def parse_shape(text: str) -> Shape:
    text = text.strip()
    if text == PLAIN:
        return None
    parts = text.split("x")
    try:
        steps, topk, draft = (int(p) for p in parts)
    except ValueError:
        raise ShapeError(f"shape {text!r}: write STEPSxTOPKxDRAFT like 3x4x16, or plain") from None
    if steps < 1 or topk < 1:
        raise ShapeError(f"shape {text!r}: steps and topk must be >= 1")
    if topk == 1 and draft != steps + 1:
        raise ShapeError(f"shape {text!r}: a chain (topk 1) verifies steps + 1 tokens: write "
                         f"{steps}x1x{steps + 1}")
    candidates = topk + (steps - 1) * topk * topk
    if topk > 1 and not 2 <= draft <= candidates + 1:
        raise ShapeError(f"shape {text!r}: a tree of {steps} steps and topk {topk} scores "
                         f"{candidates} candidates, so its draft tokens lie in 2..{candidates + 1}")
    return DraftShape(steps, topk, draft)


def parse_shapes(text: str) -> list[Shape]:
    """`plain,3x1x4,3x4x16` as shapes, each once, in the order given."""
    shapes = [parse_shape(p) for p in text.split(",") if p.strip()]
    if not shapes:
        raise ShapeError("give at least one shape, like plain,3x1x4,3x4x16")
    labels = [label(s) for s in shapes]
    repeated = sorted({x for x in labels if labels.count(x) > 1})
    if repeated:
        raise ShapeError(f"shape {repeated[0]} is listed twice")
    return shapes
