"""The figure of `specctl curves --plot`, read back from its matplotlib Figure: tok/s relative to
depth 0, predictions drawn solid only over the sampled batches, extrapolation dashed and
labelled, crossovers only where there are samples, the live table as its own strip.

The store is filled through its API with samples from the profile's cost model at batches 1 to
48 (`controller.evaluation.synthetic.sweep_samples`), as tests/test_cli_curves_freeze.py does.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pytest

from controller.cli.learned import (
    GID_CROSSOVER,
    GID_EXTRAPOLATED,
    GID_LIVE_TIER,
    GID_MEASURED_RANGE,
    curves_figure,
    load_group_model,
    plot_curves,
    sampled_range,
)
from controller.daemon.store import Store
from controller.evaluation.synthetic import sweep_samples
from sims.profile import load_profile


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "specctl.sqlite"
    samples = sweep_samples(load_profile("kimi-k25-8x-rtxpro6000-pcie"),
                            [1, 2, 4, 8, 16, 32, 48], 10.0, [0, 1, 3])  # fmt: skip
    store = Store(path)
    store.record_scrape("synthetic-0", samples[-1].t_end, samples, {})
    store.add_push(
        t=samples[-1].t_end, target="synthetic-0", kind="learned", reason="test",
        table={"version": 3, "tiers": [{"min_batch": 1, "depth": 3}, {"min_batch": 8, "depth": 1}]},
        predicted=None, outcome="good",
    )  # fmt: skip
    store.close()
    return path


def _lines(fig, gid: str) -> list:  # type: ignore[no-untyped-def]
    return [line for ax in fig.axes for line in ax.get_lines() if line.get_gid() == gid]


def test_predictions_are_solid_only_over_the_sampled_batches(store_path: Path) -> None:
    model = load_group_model(store_path)
    lo, hi = sampled_range(model)
    assert (lo, hi) == pytest.approx((1.0, 48.0), abs=0.5)
    fig = curves_figure(model, model.propose())
    try:
        solid = _lines(fig, GID_MEASURED_RANGE)
        assert len(solid) == 2 * 3  # each depth in the relative and the absolute panel
        for line in solid:
            xs = np.asarray(line.get_xdata(), float)
            assert xs.min() >= lo - 1e-9 and xs.max() <= hi + 1e-9
        dashed = _lines(fig, GID_EXTRAPOLATED)
        assert dashed and all(line.get_linestyle() == "--" for line in dashed)
        for line in dashed:  # beyond the samples, joined at the last sampled batch
            xs = np.asarray(line.get_xdata(), float)
            assert xs.min() == pytest.approx(hi) and xs.max() > hi
        legend = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
        assert "predicted, extrapolated (no samples)" in legend
        assert any(t.startswith("no samples (outside batch 1-48") for t in legend)
    finally:
        plt.close(fig)


def test_the_main_panel_is_relative_to_depth_0_with_a_line_at_1(store_path: Path) -> None:
    model = load_group_model(store_path)
    fig = curves_figure(model, model.propose())
    try:
        main = fig.axes[0]
        assert main.get_ylabel() == "tok/s ÷ depth 0"
        ones = [ln for ln in main.get_lines() if list(ln.get_ydata()) == [1.0, 1.0]]
        assert ones, "no 1.0 reference line"
        depth0 = _lines(fig, GID_MEASURED_RANGE)[0]  # depth 0 relative to itself
        assert np.allclose(depth0.get_ydata(), 1.0)
        # depth 1 runs ~10-40% above depth 0 on this profile: visible at this scale.
        depth1 = np.asarray(_lines(fig, GID_MEASURED_RANGE)[1].get_ydata(), float)
        assert depth1.min() > 1.05 and depth1.max() < 1.5
    finally:
        plt.close(fig)


def test_no_crossover_is_drawn_beyond_the_samples_and_the_live_table_has_its_strip(
    store_path: Path, tmp_path: Path
) -> None:
    """The model may place a crossover at batch 75 with no sample above 48: it is named in the
    title as beyond the samples, not drawn as if measured."""
    model = load_group_model(store_path)
    proposal = dataclasses.replace(model.propose(), crossovers=[(3, 1, 6.0), (1, 0, 75.0)])
    fig = curves_figure(model, proposal)
    try:
        lo, hi = sampled_range(model)
        drawn = [ln.get_xdata()[0] for ln in _lines(fig, GID_CROSSOVER)]
        assert drawn and all(lo <= x <= hi for x in drawn)
        assert 6.0 in drawn and 75.0 not in drawn
        title = fig.axes[0].get_title()
        assert "beyond the samples, not drawn: d1→d0 @ 75.0" in title
        assert "live table (strip): 1-7: d3 | 8+: d1" in title
        strip = fig.axes[1]
        tiers = [p for p in strip.patches if p.get_gid() == GID_LIVE_TIER]
        assert len(tiers) == 2  # d3 below 8, d1 from 8: shading only in the strip
        assert not [p for p in fig.axes[0].patches if p.get_gid() == GID_LIVE_TIER]
    finally:
        plt.close(fig)
    png = tmp_path / "curves.png"
    plot_curves(model, proposal, png)
    assert png.stat().st_size > 20_000
