"""The trace shape of benchmarks/trace_length.py scaled to a length (not its figures)."""

from __future__ import annotations

import pytest

from benchmarks.gpu.seeded.trace import parse_phases
from benchmarks.trace_length import TRACE_SHAPE, phases_text, scaled_phases


def test_the_shape_scales_to_the_length_with_its_streams_and_datasets() -> None:
    phases = scaled_phases(40)
    assert sum(p.seconds for p in phases) == pytest.approx(40, abs=0.05)
    assert [(p.concurrency, p.dataset) for p in phases] == [(c, d) for _, _, c, d in TRACE_SHAPE]
    # the 256-stream phase on b is the longest
    longest = max(phases, key=lambda p: p.seconds)
    assert (longest.concurrency, longest.dataset) == (256, "b")
    assert scaled_phases(80)[0].seconds == pytest.approx(2 * phases[0].seconds)


def test_the_phases_read_back_as_the_trace_steps_option() -> None:
    phases = scaled_phases(20)
    back = parse_phases(phases_text(phases))
    assert [(p.seconds, p.concurrency, p.dataset) for p in back] == [
        (p.seconds, p.concurrency, p.dataset) for p in phases
    ]


def test_a_length_must_be_positive() -> None:
    with pytest.raises(ValueError):
        scaled_phases(0)
