"""Statistics of timing samples: the summary a row reports, the stopping rule's error
estimate, and the significance test `bench compare` applies.

The median is the reported latency (a few slow samples, from a clock change or a stray
process, move the mean but not the median). Its standard error comes from the
distribution-free confidence interval of the median: with n sorted samples, the ranks
(n - z*sqrt(n))/2 and 1 + (n + z*sqrt(n))/2 bracket the true median with ~95% probability
(z = 1.96) whatever the distribution, so half that interval over z is a standard error
that needs no normality and no resampling.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

import numpy as np

Z95 = 1.959964


@dataclass(frozen=True)
class Summary:
    """Latency statistics of one measurement, in seconds."""

    n: int
    median: float
    p20: float
    p80: float
    mean: float
    std: float
    min: float
    max: float
    rse_median: float  # standard error of the median / median
    rse_mean: float  # standard error of the mean / mean

    @property
    def spread(self) -> float:
        """(p80 - p20) / median: how wide the middle 60% of samples is, relative."""
        return (self.p80 - self.p20) / self.median if self.median > 0 else math.inf

    def to_json(self) -> dict:
        return asdict(self)


def median_rse(samples: Sequence[float]) -> float:
    """Relative standard error of the median, from the order-statistic 95% interval.

    inf for fewer than 3 samples (no interval exists) or a zero median.
    """
    n = len(samples)
    if n < 3:
        return math.inf
    x = np.sort(np.asarray(samples, dtype=np.float64))
    med = float(np.median(x))
    if med <= 0:
        return math.inf
    half = Z95 * math.sqrt(n) / 2
    lo = max(int(math.floor(n / 2 - half)), 1)  # 1-based rank of the lower bound
    hi = min(int(math.ceil(1 + n / 2 + half)), n)  # 1-based rank of the upper bound
    return float(x[hi - 1] - x[lo - 1]) / (2 * Z95 * med)


def mean_rse(samples: Sequence[float]) -> float:
    n = len(samples)
    if n < 2:
        return math.inf
    x = np.asarray(samples, dtype=np.float64)
    mean = float(x.mean())
    return float(x.std(ddof=1)) / math.sqrt(n) / mean if mean > 0 else math.inf


def summarize(samples: Sequence[float]) -> Summary:
    if not len(samples):
        raise ValueError("summarize needs at least one sample")
    x = np.asarray(samples, dtype=np.float64)
    p20, med, p80 = (float(v) for v in np.percentile(x, [20, 50, 80]))
    std = float(x.std(ddof=1)) if len(x) > 1 else 0.0
    return Summary(len(x), med, p20, p80, float(x.mean()), std, float(x.min()), float(x.max()),
                   median_rse(x), mean_rse(x))


# --- significance --------------------------------------------------------------------------

def require_scipy(what: str):
    """scipy.stats, or a SystemExit naming the extra that installs it."""
    try:
        import scipy.stats
    except ImportError:
        raise SystemExit(f"speedlight: {what} needs scipy (the 'stats' extra): "
                         f"pip install 'speedlight[stats]'") from None
    return scipy.stats


def slower_p_value(old: Sequence[float], new: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value for 'new samples are larger (slower) than old'.

    Rank-based, so it needs no assumption on the shape of timing distributions; with
    n1 = n2 = 5 the smallest p it can give is 1/252 ~ 0.004, so very short runs can never
    be called significant at small alpha.
    """
    st = require_scipy("a significance test (Mann-Whitney U)")
    if len(old) < 1 or len(new) < 1:
        return 1.0
    return float(st.mannwhitneyu(new, old, alternative="greater").pvalue)


def faster_p_value(old: Sequence[float], new: Sequence[float]) -> float:
    """One-sided Mann-Whitney U p-value for 'new samples are smaller (faster) than old'."""
    return slower_p_value(new, old)


def geomean(values: Sequence[float]) -> float | None:
    vals = [v for v in values if v is not None and v > 0 and math.isfinite(v)]
    if not vals:
        return None
    return float(math.exp(sum(math.log(v) for v in vals) / len(vals)))
