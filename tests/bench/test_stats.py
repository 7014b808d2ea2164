import math

import numpy as np
import pytest

from speedlight.bench import stats


def test_summary_matches_numpy():
    x = np.random.default_rng(0).lognormal(0.0, 0.2, 101)
    s = stats.summarize(x)
    assert s.n == 101
    assert s.median == pytest.approx(np.median(x))
    assert (s.p20, s.p80) == (pytest.approx(np.percentile(x, 20)), pytest.approx(np.percentile(x, 80)))
    assert s.mean == pytest.approx(x.mean()) and s.std == pytest.approx(x.std(ddof=1))
    assert s.spread == pytest.approx((s.p80 - s.p20) / s.median)
    assert s.rse_mean == pytest.approx(x.std(ddof=1) / math.sqrt(101) / x.mean())


def test_median_rse_is_close_to_the_normal_theory_value():
    # for normal samples, SE(median) ~ sqrt(pi/2) * sigma / sqrt(n)
    x = 100.0 + np.random.default_rng(1).normal(0.0, 1.0, 4000)
    expected = math.sqrt(math.pi / 2) / math.sqrt(4000) / 100.0
    assert stats.median_rse(x) == pytest.approx(expected, rel=0.15)


def test_median_rse_shrinks_with_more_samples_and_ignores_outliers():
    rng = np.random.default_rng(2)
    small, large = rng.normal(10, 1, 20), rng.normal(10, 1, 2000)
    assert stats.median_rse(large) < stats.median_rse(small)
    spiked = np.concatenate([large, [1e6] * 20])  # 1% of samples 100000x slower
    assert stats.median_rse(spiked) == pytest.approx(stats.median_rse(large), rel=0.2)
    assert stats.mean_rse(spiked) > 50 * stats.mean_rse(large)


@pytest.mark.parametrize("x", [[], [1.0], [1.0, 2.0], [0.0, 0.0, 0.0]])
def test_median_rse_is_infinite_without_an_interval(x):
    assert stats.median_rse(x) == math.inf


def test_one_sided_mann_whitney():
    rng = np.random.default_rng(3)
    old = rng.lognormal(0, 0.05, 50)
    assert stats.slower_p_value(old, old * 1.2) < 1e-6
    assert stats.faster_p_value(old, old * 1.2) > 0.99
    assert stats.faster_p_value(old, old / 1.2) < 1e-6


def test_geomean_skips_missing():
    assert stats.geomean([2.0, 8.0, None]) == pytest.approx(4.0)
    assert stats.geomean([None]) is None


def test_missing_scipy_names_the_extra(monkeypatch):
    import builtins
    real = builtins.__import__

    def no_scipy(name, *a, **k):
        if name.startswith("scipy"):
            raise ImportError("no scipy")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", no_scipy)
    with pytest.raises(SystemExit, match=r"speedlight\[stats\]"):
        stats.slower_p_value([1.0, 2.0], [3.0, 4.0])
