"""The only tests that may take more than tests/cpu_budget.py's BUDGET_S of CPU time, each
with the reason it needs it: at most 25 entries. An entry is a test's node id without its
parametrization (it covers every parametrization) or with it (that one only)."""

SLOW: dict[str, str] = {
}

assert len(SLOW) <= 25, "at most 25 slow tests"
