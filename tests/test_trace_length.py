"""The GPU trace's default shape, which benchmarks/trace_length.py scales, at a length (not
the benchmark's figures)."""

from __future__ import annotations

import pytest

from benchmarks.gpu.seeded.trace import (
    DEFAULT_SHAPE,
    TraceError,
    default_trace,
    parse_phases,
    phases_text,
)


def test_the_shape_scales_to_the_length_with_its_streams_and_datasets() -> None:
    phases = default_trace(40)
    assert sum(p.seconds for p in phases) == pytest.approx(40, abs=0.05)
    assert [(p.concurrency, p.dataset) for p in phases] == [(c, d) for _, _, c, d in DEFAULT_SHAPE]
    # the 256-stream phase on b is the longest
    longest = max(phases, key=lambda p: p.seconds)
    assert (longest.concurrency, longest.dataset) == (256, "b")
    assert default_trace(80)[0].seconds == pytest.approx(2 * phases[0].seconds)


def test_the_phases_read_back_as_the_trace_steps_option() -> None:
    phases = default_trace(20)
    back = parse_phases(phases_text(phases))
    assert [(p.seconds, p.concurrency, p.dataset) for p in back] == [
        (p.seconds, p.concurrency, p.dataset) for p in phases
    ]


def test_a_trace_too_short_for_its_phases_is_refused() -> None:
    with pytest.raises(TraceError, match="at least 12 s"):
        default_trace(11)
