"""The host-to-device copy probe (benchmarks/gpu/h2d_probe.py) without a GPU.

The probe's timing, its table and its verdict run here against a stand-in device (no CUDA on
this machine): a clock that the stand-in moves, a pageable copy that waits out whatever its
stream waits for (the behaviour the probe looks for) and a pinned one that does not. On the
GPU machine `CudaDevice` does the real copies (h200_session.sh h2dprobe).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.gpu import h2d_probe


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class BlockingPageable:
    def __init__(self, clock: Clock) -> None:
        self.clock, self.pending_s, self.copies = clock, 0.0, 0

    def hold_current_stream(self, ms: float) -> None:
        self.pending_s = ms / 1000.0

    def copy(self, values: list[int], pinned: bool) -> None:
        self.copies += 1
        self.clock.now += 5e-6 + (0.0 if pinned else self.pending_s)
        if not pinned:
            self.pending_s = 0.0  # it waited the stream out: the next copy finds it clear

    def synchronize(self) -> None:
        self.pending_s = 0.0


def test_a_pageable_copy_that_waits_for_its_stream_is_named() -> None:
    clock = Clock()
    device = BlockingPageable(clock)
    cells = h2d_probe.probe(device, [4, 128], wait_ms=3.0, repeats=5, clock=clock)
    assert device.copies == 2 * 2 * 2 * 5 * 2  # sizes, modes, waits, repeats, the pair
    by = {(c.size, c.mode, c.behind_wait): c for c in cells}
    assert by[(4, "pageable", True)].host_us == pytest.approx(3005.0)
    assert by[(4, "pageable", True)].second_us == pytest.approx(5.0)
    assert by[(4, "pinned", True)].host_us == pytest.approx(5.0)
    assert by[(128, "pageable", False)].host_us == pytest.approx(5.0)
    lines = h2d_probe.render(cells, 3.0)
    assert "      4 values: pageable 5 (5) / 3005 (5), pinned 5 (5) / 5 (5)" in lines
    assert lines[-1] == "a copy waited for its stream: pageable (4 values), pageable (128 values)"


def test_copies_that_never_wait_say_so(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                       ) -> None:
    clock = Clock()
    device = BlockingPageable(clock)
    device.hold_current_stream = lambda ms: None  # type: ignore[method-assign]
    out = tmp_path / "probe.json"
    assert h2d_probe.main(["--sizes", "8", "--repeats", "3", "--json", str(out)],
                          device=device) == 0
    assert "no copy waited for its stream" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["wait_ms"] == 3.0 and len(data["cells"]) == 4


@pytest.mark.parametrize(("argv", "message"), [
    (["--sizes", "four"], "--sizes 'four'"),
    (["--repeats", "0"], "must be positive"),
])
def test_bad_arguments_are_named(argv: list[str], message: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert h2d_probe.main(argv, device=BlockingPageable(Clock())) == 2
    assert message in capsys.readouterr().err


def test_without_a_gpu_it_says_where_to_run_it(capsys: pytest.CaptureFixture[str]) -> None:
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU: the probe would run")
    except ImportError:
        pass
    assert h2d_probe.main(["--repeats", "1"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err
