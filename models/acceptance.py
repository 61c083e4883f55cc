"""Acceptance length per depth: the drifting half of the model.

Acceptance is a property of the workload (prompt mix, sampling settings), not of the hardware,
so it gets a short memory: counters enter with weight 2 ** (-age / half_life). For depth s >= 1
the quantity learned is m_s = accepted draft tokens per request per iteration (accept length
L_s = 1 + m_s; depth 0 has L = 1 exactly), with a conjugate Gamma posterior

    m_s ~ Gamma(shape = k * m0_s + A_s / phi,  rate = k + N_s / phi)

where A_s, N_s are the decayed accepted-draft and request-step counts, phi the dispersion (one
request-step is not an independent draw: a request's difficulty persists across iterations)
and k the prior strength in request-steps. The prior mean m0_s comes from the other depths:
draft position j is accepted (given 1..j-1 were) with probability p_j = q * rho^(j-1), so

    m_s = sum_{j<=s} prod_{i<=j} p_i

A level q and a per-position decay rho fitted to the depths that have evidence predict the
ones that do not; rho (how fast a draft model loses the thread) is held near `prior_decay`
unless several depths have evidence. After a workload shift the incumbent's fresh counters
move q, and with it the prior of every depth the server rarely runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from models.evidence import Cells

_Q_GRID = np.linspace(0.01, 0.99, 99)
_RHO_GRID = np.linspace(0.70, 1.05, 36)
_RHO_PENALTY = 2000.0  # pulls rho toward the prior unless several depths have much evidence


def chain_accepted(q: np.ndarray | float, rho: np.ndarray | float, depth: int) -> np.ndarray:
    """Expected accepted drafts at `depth` when position j is accepted w.p. q * rho**(j-1)."""
    q, rho = np.broadcast_arrays(np.asarray(q, float), np.asarray(rho, float))
    total = np.zeros(q.shape)
    survive = np.ones(q.shape)
    for j in range(depth):
        survive = survive * np.clip(q * rho**j, 0.0, 1.0)
        total = total + survive
    return total


class AcceptanceModel:
    """Exponentially weighted Gamma posterior of accepted drafts per depth."""

    def __init__(
        self,
        depths: Sequence[int],
        prior_rate: float = 0.6,
        prior_decay: float = 0.9,
        prior_strength: float = 20.0,
        dispersion: float = 2.0,
    ) -> None:
        self.depths = sorted(set(depths))
        self.prior_rate = prior_rate
        self.prior_decay = prior_decay
        self.prior_strength = prior_strength
        self.dispersion = dispersion
        self.q_: float = prior_rate
        self.rho_: float = prior_decay
        self.shape_: dict[int, float] = {}
        self.rate_: dict[int, float] = {}
        self.request_steps_: dict[int, float] = {}

    def fit(self, cells: Cells) -> None:
        accepted: dict[int, float] = {}
        steps: dict[int, float] = {}
        for d in self.depths:
            m = cells.depth == d
            steps[d] = float(cells.request_steps[m].sum())
            accepted[d] = float((cells.tokens[m] - cells.request_steps[m]).sum())
        self.q_, self.rho_ = self._fit_chain(accepted, steps)
        self.request_steps_ = steps
        for d in self.depths:
            if d == 0:
                continue
            prior_mean = float(chain_accepted(self.q_, self.rho_, d))
            self.shape_[d] = self.prior_strength * prior_mean + accepted[d] / self.dispersion
            self.rate_[d] = self.prior_strength + steps[d] / self.dispersion

    def _fit_chain(
        self, accepted: dict[int, float], steps: dict[int, float]
    ) -> tuple[float, float]:
        observed = [d for d in self.depths if d > 0 and steps[d] > 0]
        if not observed:
            return self.prior_rate, self.prior_decay
        q, rho = np.meshgrid(_Q_GRID, _RHO_GRID, indexing="ij")
        loss = _RHO_PENALTY * (rho - self.prior_decay) ** 2
        for d in observed:
            m_obs = accepted[d] / steps[d]
            # Relative error, weighted by evidence (capped so one depth cannot silence another
            # once both have plenty).
            rel = (chain_accepted(q, rho, d) - m_obs) / max(m_obs, 0.05)
            loss = loss + min(steps[d] / self.dispersion, 1e4) * rel**2
        i, j = np.unravel_index(int(np.argmin(loss)), loss.shape)
        return float(_Q_GRID[i]), float(_RHO_GRID[j])

    def mean_length(self, depth: int) -> float:
        """Posterior mean accept length (tokens per request per iteration, bonus included)."""
        if depth == 0:
            return 1.0
        if depth not in self.shape_:
            return 1.0 + float(chain_accepted(self.q_, self.rho_, depth))
        return 1.0 + min(self.shape_[depth] / self.rate_[depth], float(depth))

    def std_length(self, depth: int) -> float:
        if depth == 0 or depth not in self.shape_:
            return 0.0
        return float(np.sqrt(self.shape_[depth]) / self.rate_[depth])

    def draw_lengths(self, depth: int, rng: np.random.Generator, k: int) -> np.ndarray:
        """k posterior draws of the accept length at `depth`."""
        if depth == 0:
            return np.ones(k)
        if depth not in self.shape_:
            return np.full(k, self.mean_length(depth))
        m = rng.gamma(self.shape_[depth], 1.0 / self.rate_[depth], size=k)
        return np.asarray(1.0 + np.clip(m, 0.0, float(depth)))

    def to_json(self) -> dict[str, Any]:
        return {
            "q": self.q_,
            "rho": self.rho_,
            "shape": {str(d): v for d, v in self.shape_.items()},
            "rate": {str(d): v for d, v in self.rate_.items()},
            "request_steps": {str(d): v for d, v in self.request_steps_.items()},
        }

    def load_json(self, data: dict[str, Any]) -> None:
        self.q_ = float(data["q"])
        self.rho_ = float(data["rho"])
        self.shape_ = {int(d): float(v) for d, v in data["shape"].items()}
        self.rate_ = {int(d): float(v) for d, v in data["rate"].items()}
        self.request_steps_ = {int(d): float(v) for d, v in data["request_steps"].items()}
