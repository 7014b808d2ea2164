"""Benchmarks: timing (timer), statistics (stats), baselines, the runner that turns each
measurement into a row (runner, metrics), run-to-run regression checks (compare), plots,
the README's performance table (table), and the GPU ceilings probe (probe)."""
