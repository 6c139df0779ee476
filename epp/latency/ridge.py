"""Online Bayesian ridge regression in pure Python, for a handful of features.

:class:`OnlineBayesianRidge` fits scikit-learn's ``BayesianRidge`` model on standardised features from decayed
sufficient statistics instead of stored samples: :meth:`~OnlineBayesianRidge.add` folds one sample in (O(d²),
forgetting old samples over about ``window``), :meth:`~OnlineBayesianRidge.fit` runs MacKay's evidence maximisation
warm-started from the previous fit, and :meth:`~OnlineBayesianRidge.predict` is one dot product (plus ``z × σ`` for
a quantile objective). Not thread-safe (EPP calls it from the event loop only); :meth:`predict` before the first
:meth:`fit` returns the intercept 0.
"""

from __future__ import annotations

import math
from operator import mul
from typing import Sequence

__all__ = ["OnlineBayesianRidge", "solve_inverse"]

_EPS = 1e-12
_PRIOR = 1e-6  # scikit-learn's alpha_1 = alpha_2 = lambda_1 = lambda_2


class OnlineBayesianRidge:
    """Bayesian ridge over ``dim`` features, fitted from exponentially decayed sufficient statistics."""

    __slots__ = ("dim", "decay", "weight", "count", "_sx", "_sy", "_sxx", "_sxy", "_syy", "alpha", "lambda_",
                 "coef", "intercept", "noise_std", "fitted")

    def __init__(self, dim: int, window: float = 1000.0) -> None:
        if dim < 1 or window < 1:
            raise ValueError("dim and window must be >= 1")
        self.dim = dim
        self.decay = 1.0 - 1.0 / window
        self.weight = 0.0
        self.count = 0
        """Samples added (not decayed)."""
        self._sx = [0.0] * dim
        self._sy = 0.0
        self._sxx = [[0.0] * dim for _ in range(dim)]
        self._sxy = [0.0] * dim
        self._syy = 0.0
        self.alpha = 0.0
        self.lambda_ = 1.0
        self.coef = [0.0] * dim
        """Coefficients in raw feature units: ``y ≈ intercept + coef · x``."""
        self.intercept = 0.0
        self.noise_std = 0.0
        self.fitted = False

    def add(self, x: Sequence[float], y: float) -> None:
        """Fold one sample into the statistics (older ones decay by ``1 − 1/window``)."""
        b, sx, sxx, sxy = self.decay, self._sx, self._sxx, self._sxy
        self.weight = b * self.weight + 1.0
        self.count += 1
        self._sy = b * self._sy + y
        self._syy = b * self._syy + y * y
        for i, xi in enumerate(x):
            sx[i] = b * sx[i] + xi
            sxy[i] = b * sxy[i] + xi * y
            row = sxx[i]
            for j in range(i, self.dim):
                row[j] = b * row[j] + xi * x[j]

    def predict(self, x: Sequence[float], z: float = 0.0) -> float:
        """``intercept + coef · x + z × noise_std`` (z = 0: the mean; z ≈ 1.28: the 90th percentile)."""
        y = self.intercept + sum(map(mul, self.coef, x))
        return y + z * self.noise_std if z else y

    def fit(self, max_iter: int = 300, tol: float = 1e-3) -> None:
        """Refit from the statistics (see the module doc); needs at least two samples."""
        n = self.weight
        if self.count < 2 or n <= 0:
            return
        mean = [s / n for s in self._sx]
        y_mean = self._sy / n
        active, scale = self._active(mean, n)
        gram, g, yy = self._standardised(active, scale, n, y_mean)
        w = self._evidence(gram, g, yy, n, max_iter, tol)
        coef = [0.0] * self.dim
        for k, j in enumerate(active):
            coef[j] = w[k] / scale[k]
        self.coef = coef
        self.intercept = y_mean - sum(c * m for c, m in zip(coef, mean))
        self.noise_std = 1.0 / math.sqrt(self.alpha) if self.alpha > 0 else 0.0
        self.fitted = True

    def _active(self, mean: list[float], n: float) -> tuple[list[int], list[float]]:
        """Features with variance (index, standard deviation); a constant one drops out."""
        active: list[int] = []
        scale: list[float] = []
        for j in range(self.dim):
            var = (self._sxx[j][j] - self._sx[j] * mean[j]) / n
            if var > _EPS * (1.0 + mean[j] * mean[j]):
                active.append(j)
                scale.append(math.sqrt(var))
        return active, scale

    def _standardised(self, active: list[int], scale: list[float], n: float,
                      y_mean: float) -> tuple[list[list[float]], list[float], float]:
        """Centred, standardised ``XᵀX``, ``Xᵀy`` and ``yᵀy`` over the active features."""
        sx, sxx, sxy = self._sx, self._sxx, self._sxy
        gram = [[0.0] * len(active) for _ in active]
        for a, i in enumerate(active):
            for b in range(a, len(active)):
                j = active[b]
                v = (sxx[i][j] - sx[i] * sx[j] / n) / (scale[a] * scale[b])
                gram[a][b] = gram[b][a] = v
        g = [(sxy[i] - sx[i] * self._sy / n) / scale[a] for a, i in enumerate(active)]
        yy = max(0.0, self._syy - self._sy * y_mean)
        return gram, g, yy

    def _evidence(self, gram: list[list[float]], g: list[float], yy: float, n: float, max_iter: int,
                  tol: float) -> list[float]:
        """MacKay's updates of α (noise precision) and λ (weight precision); returns the weights."""
        d = len(g)
        if self.alpha <= 0:
            self.alpha = 1.0 / (yy / n + _EPS)
        alpha, lam = self.alpha, self.lambda_
        w = [0.0] * d
        for _ in range(max_iter):
            sigma = solve_inverse([[alpha * gram[i][j] + (lam if i == j else 0.0) for j in range(d)]
                                   for i in range(d)])
            new_w = [alpha * sum(sigma[i][k] * g[k] for k in range(d)) for i in range(d)]
            gamma = d - lam * sum(sigma[i][i] for i in range(d))
            resid = max(0.0, yy - 2.0 * _dot(new_w, g) + _quad(gram, new_w))
            lam = (gamma + 2 * _PRIOR) / (_dot(new_w, new_w) + 2 * _PRIOR)
            alpha = (n - gamma + 2 * _PRIOR) / (resid + 2 * _PRIOR)
            converged = sum(abs(a - b) for a, b in zip(w, new_w)) < tol
            w = new_w
            if converged:
                break
        self.alpha, self.lambda_ = alpha, lam
        if d:
            sigma = solve_inverse([[alpha * gram[i][j] + (lam if i == j else 0.0) for j in range(d)]
                                   for i in range(d)])
            w = [alpha * sum(sigma[i][k] * g[k] for k in range(d)) for i in range(d)]
        return w


def _dot(a: Sequence[float], b: Sequence[float]) -> float:
    return sum(x * y for x, y in zip(a, b))


def _quad(m: list[list[float]], v: list[float]) -> float:
    """``vᵀ M v``."""
    return sum(v[i] * _dot(row, v) for i, row in enumerate(m))


def solve_inverse(a: list[list[float]]) -> list[list[float]]:
    """The inverse of the square matrix ``a`` by Gauss-Jordan elimination with partial pivoting (``a`` is not
    changed). Raises ``ZeroDivisionError`` for a singular matrix; EPP only inverts ``λI + αG`` with λ > 0, which
    is positive definite."""
    n = len(a)
    m = [list(row) + [1.0 if i == j else 0.0 for j in range(n)] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        m[col], m[pivot] = m[pivot], m[col]
        p = m[col][col]
        if p == 0.0:
            raise ZeroDivisionError("singular matrix")
        row = m[col] = [v / p for v in m[col]]
        for r in range(n):
            if r != col and m[r][col] != 0.0:
                f = m[r][col]
                m[r] = [v - f * u for v, u in zip(m[r], row)]
    return [row[n:] for row in m]
