"""Draft shapes as SGLang's EAGLE flags take them: steps x topk x draft tokens.

The notation is the simulator's (`sglang_hooks/draft_shape.py`, standard library only), so that the
harness's shapes and a profile's fitted shapes are read by one parser.
"""

from __future__ import annotations

from sglang_hooks.draft_shape import (
    PLAIN,
    DraftShape,
    Shape,
    ShapeError,
    label,
    parse_shape,
    parse_shapes,
)

__all__ = ["PLAIN", "DraftShape", "Shape", "ShapeError", "label", "parse_shape", "parse_shapes"]
