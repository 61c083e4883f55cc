"""Step time (ms per decode iteration) against batch size and depth: the stable half of the model.

`RooflineStepModel` (the one the learner uses) is one Bayesian linear model pooled over all
depths, on features shaped like the physics of a speculative iteration at depth s, batch B,
with T = B * (s + 1) tokens through the target:

    step(s, B) ~ c0 + c1*s + c2*s*B      (draft forwards: fixed + per-request, s of them)
               + c3*B                    (KV-cache read per request, and with c2 the linear
                                          per-token costs, T = B + s*B)
               + f(T)                    (target + draft extend: weights/experts read, compute)
               + sum_i k_i * B * exp(-T / rho_i)         (KV reads fade behind compute)
    f(T)       = sum_j a_j * (1 - exp(-T / tau_j))       (experts touched by T tokens)
               + sum_k h_k * max(0, T - kappa_k)         (the memory -> compute knee)

Because the target cost depends on tokens, evidence at depth 0, batch 48 informs depth 3 at
batch 12: few probes suffice to place a depth that the server rarely runs. scikit-learn's
`BayesianRidge` gives the posterior covariance of the coefficients (for Thompson sampling) and
learns both the noise and the prior precision from the data.

`IsotonicStepModel` and `PerDepthLinearStepModel` are the alternatives the comparison in
benchmarks/model_comparison.py measures against (see docs/learning.md).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import BayesianRidge

from models.evidence import Cells

_SCALE = 64.0  # batch / token counts enter the features in units of 64 so coefficients are O(1)
_SATURATION_TAUS = (8.0, 32.0, 128.0)
_KV_FADE_TAUS = (32.0, 128.0, 512.0)
_KNEES = tuple(float(k) for k in np.geomspace(16, 2048, 15))  # ratio sqrt(2)


class StepModel(Protocol):
    """What the comparison and the learner need from a step-time model."""

    name: str

    def fit(self, cells: Cells, step_cv: float, model_error: float) -> None: ...

    def predict(self, depth: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mean step ms, std of the mean in ms; NaN where the model cannot say)."""
        ...


def roofline_features(depth: np.ndarray, batch: np.ndarray) -> np.ndarray:
    """Design matrix (n, p) of the pooled roofline model."""
    s = np.asarray(depth, float)
    b = np.asarray(batch, float)
    t = b * (s + 1.0)
    # No linear T column: T = B + s*B is already spanned by the two batch columns.
    cols = [np.ones_like(b), s, s * b / _SCALE, b / _SCALE]
    cols += [1.0 - np.exp(-t / tau) for tau in _SATURATION_TAUS]
    cols += [np.maximum(t - k, 0.0) / _SCALE for k in _KNEES]
    # Per-request memory traffic (KV reads) sits inside the roofline: it costs in full while
    # the forward is memory-bound and fades once compute dominates, so its slope in B decays
    # with T.
    cols += [b / _SCALE * np.exp(-t / tau) for tau in _KV_FADE_TAUS]
    return np.stack(cols, axis=-1)


def cell_weights(cells: Cells, step_cv: float, model_error: float) -> np.ndarray:
    """Inverse relative variance of each cell's mean step time.

    A cell's mean over n iterations has relative variance cv^2 / n from step noise, plus a
    floor `model_error^2` for what no smooth model captures; the floor stops a cell with 10^6
    iterations from pinning the fit on a detail the features cannot represent.
    """
    n = np.maximum(cells.iterations, 1e-9)
    return np.asarray(1.0 / (step_cv**2 / n + model_error**2))


class RooflineStepModel:
    """Pooled Bayesian linear model on roofline features (the learner's choice)."""

    name = "roofline-bayes"

    def __init__(self) -> None:
        self.coef_: np.ndarray | None = None
        self.cov_: np.ndarray | None = None
        self.scale_ms_: float = 1.0
        self.noise_precision_: float = 1.0

    @property
    def fitted(self) -> bool:
        return self.coef_ is not None

    def fit(self, cells: Cells, step_cv: float = 0.05, model_error: float = 0.01) -> None:
        if len(cells) == 0:
            self.coef_ = self.cov_ = None
            return
        x = roofline_features(cells.depth, cells.mean_batch)
        y_ms = cells.step_ms
        w_rel = cell_weights(cells, step_cv, model_error)
        # Work in units of the typical step so the prior and the relative weights are unitless:
        # weight = 1 / absolute variance = w_rel / y^2, rescaled by scale^2.
        scale = float(np.average(y_ms, weights=w_rel))
        y = y_ms / scale
        w = w_rel / np.maximum(y, 1e-6) ** 2
        # Rescale rows by sqrt(weight) ourselves: BayesianRidge's own `sample_weight` is taken
        # relative to the other rows, which throws away the absolute precision of the cells and
        # with it the scale of the posterior covariance that exploration relies on.
        root = np.sqrt(w)
        reg = BayesianRidge(fit_intercept=False, max_iter=500, tol=1e-8)
        reg.fit(x * root[:, None], y * root)
        self.coef_ = np.asarray(reg.coef_, float)
        self.cov_ = np.asarray(reg.sigma_, float)
        self.scale_ms_ = scale
        self.noise_precision_ = float(reg.alpha_)

    def predict(self, depth: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        depth, batch = np.broadcast_arrays(np.asarray(depth, float), np.asarray(batch, float))
        if self.coef_ is None or self.cov_ is None:
            nan = np.full(depth.shape, np.nan)
            return nan, nan.copy()
        x = roofline_features(depth, batch)
        mean = x @ self.coef_ * self.scale_ms_
        var = np.einsum("...i,ij,...j->...", x, self.cov_, x)
        return mean, np.sqrt(np.maximum(var, 0.0)) * self.scale_ms_

    def draw_coefficients(self, rng: np.random.Generator, k: int) -> np.ndarray:
        """k posterior draws of the coefficients (k, p), in units of `scale_ms_`."""
        assert self.coef_ is not None and self.cov_ is not None
        cov = (self.cov_ + self.cov_.T) / 2.0
        jitter = 1e-12 * max(float(np.trace(cov)), 1e-12)
        chol = np.linalg.cholesky(cov + jitter * np.eye(cov.shape[0]))
        z = rng.standard_normal((k, cov.shape[0]))
        return np.asarray(self.coef_ + z @ chol.T)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "coef": None if self.coef_ is None else self.coef_.tolist(),
            "cov": None if self.cov_ is None else self.cov_.tolist(),
            "scale_ms": self.scale_ms_,
            "noise_precision": self.noise_precision_,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> RooflineStepModel:
        m = cls()
        if data.get("coef") is not None:
            m.coef_ = np.asarray(data["coef"], float)
            m.cov_ = np.asarray(data["cov"], float)
        m.scale_ms_ = float(data["scale_ms"])
        m.noise_precision_ = float(data["noise_precision"])
        return m


class IsotonicStepModel:
    """Per-depth isotonic regression of step time on batch size (no shape, no pooling).

    Monotone by construction and assumption-free, but it knows nothing about a depth it has not
    seen, extrapolates flat, and has no posterior: the comparison's baseline.
    """

    name = "isotonic-per-depth"

    def __init__(self) -> None:
        self.models_: dict[int, IsotonicRegression] = {}

    def fit(self, cells: Cells, step_cv: float = 0.05, model_error: float = 0.01) -> None:
        self.models_ = {}
        w = cell_weights(cells, step_cv, model_error)
        for d in np.unique(cells.depth):
            m = cells.depth == d
            iso = IsotonicRegression(increasing=True, out_of_bounds="clip")
            iso.fit(cells.mean_batch[m], cells.step_ms[m], sample_weight=w[m])
            self.models_[int(d)] = iso

    def predict(self, depth: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        depth, batch = np.broadcast_arrays(np.asarray(depth, int), np.asarray(batch, float))
        mean = np.full(depth.shape, np.nan)
        for d, iso in self.models_.items():
            m = depth == d
            if m.any():
                mean[m] = iso.predict(batch[m])
        return mean, np.full(depth.shape, np.nan)


class PerDepthLinearStepModel:
    """The roofline features without the depth terms, fitted per depth (no pooling).

    Isolates what pooling across depths buys: same shape, same estimator, separate fits.
    """

    name = "roofline-bayes-per-depth"

    def __init__(self) -> None:
        self.models_: dict[int, RooflineStepModel] = {}

    def fit(self, cells: Cells, step_cv: float = 0.05, model_error: float = 0.01) -> None:
        self.models_ = {}
        for d in np.unique(cells.depth):
            m = cells.depth == d
            sub = Cells(*(np.asarray(getattr(cells, f))[m] for f in _CELL_FIELDS))
            model = RooflineStepModel()
            model.fit(sub, step_cv, model_error)
            self.models_[int(d)] = model

    def predict(self, depth: np.ndarray, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        depth, batch = np.broadcast_arrays(np.asarray(depth, int), np.asarray(batch, float))
        mean = np.full(depth.shape, np.nan)
        std = np.full(depth.shape, np.nan)
        for d, model in self.models_.items():
            m = depth == d
            if m.any():
                mean[m], std[m] = model.predict(depth[m], batch[m])
        return mean, std


_CELL_FIELDS = (
    "depth",
    "bucket",
    "iterations",
    "request_steps",
    "tokens",
    "gpu_seconds",
)
