"""Pearson chi-square goodness of fit against an exact law, shared by the losslessness tests."""

from __future__ import annotations

from collections import Counter

import numpy as np
from scipy import stats


def chisq_pvalue(counts: Counter, probs: dict, n: int) -> float:
    """Pearson chi-square p-value of ``counts`` against ``probs``; cells with expected < 5 are pooled.

    Any observation in a zero-probability cell fails the test at once (p = 0).
    """
    impossible = [k for k, c in counts.items() if c and probs.get(k, 0.0) == 0.0]
    if impossible:
        return 0.0
    cells = sorted(((probs[k] * n, counts.get(k, 0)) for k in probs if probs[k] > 0), key=lambda x: x[0])
    exp, obs = [], []
    pool_e = pool_o = 0.0
    for e, o in cells:
        if e < 5:
            pool_e, pool_o = pool_e + e, pool_o + o
        else:
            exp.append(e)
            obs.append(o)
    if pool_e > 0:
        if pool_e >= 5 or not exp:
            exp.append(pool_e)
            obs.append(pool_o)
        else:  # too small on its own: merge into the smallest regular cell
            exp[0] += pool_e
            obs[0] += pool_o
    exp, obs = np.asarray(exp), np.asarray(obs)
    if len(exp) < 2:
        return 1.0
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, len(exp) - 1))
