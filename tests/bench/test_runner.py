"""The runner on CPU with cheap plain-PyTorch specs: what each row holds, what is withheld
and why, which part each mode times, and that an interrupted run keeps what it wrote."""

import dataclasses

import pytest
import torch

from speedlight import cli, results
from speedlight.bench import runner
from speedlight.bench.baselines import Baselines, CompileOptions, Contender
from speedlight.bench.runner import Bench, Settings
from speedlight.bench.timer import StopRule, clock_for
from speedlight.spec import Case
from tests.bench import toy_specs
from tests.bench.toy_specs import SLOW, TOY, WRONG

FAST = StopRule(target_rse=0.5, min_samples=3, max_samples=5, time_cap_s=0.05, warmup_calls=1,
                warmup_s=0.0)


def _bench(baselines=("torch-eager", "liger"), **settings):
    return Bench("cpu", Settings(rule=FAST, **settings), Baselines(baselines), suite="quick")


def _by(rows, impl, mode):
    (row,) = [r for r in rows if r["implementation"] == impl and r["mode"] == mode]
    return row


def test_rows_for_every_implementation_and_mode():
    rows = _bench().case_rows(TOY, TOY.cases("quick")[0])
    assert {(r["implementation"], r["mode"]) for r in rows} == {
        (i, m) for i in ("speedlight", "torch-eager", "liger") for m in runner.MODES}
    ours = _by(rows, "speedlight", "fwd")
    assert ours["status"] == "ok" and ours["verified"] is True
    assert ours["representative"] is False and ours["runtime"] == "cpu-interpreter"
    assert len(ours["samples_us"]) == ours["n_samples"] >= 3
    assert ours["p20_us"] <= ours["median_us"] <= ours["p80_us"]
    assert ours["bytes"] == TOY.cost(TOY.cases("quick")[0], "fwd").bytes
    assert ours["gbps"] == pytest.approx(ours["bytes"] / ours["median_us"] / 1e3)
    assert ours["timing"]["method"] == "perf_counter" and ours["timing"]["input_copies"] >= 1
    for key in ("torch", "triton", "git", "device", "timestamp", "clocks", "case", "suite"):
        assert key in ours
    assert ours["speedup"]["torch-eager"] is not None
    # Liger does not run on the CPU: unavailable, with the reason, never dropped
    liger = _by(rows, "liger", "fwd")
    assert liger["status"] == "unavailable" and "CUDA" in liger["reason"]
    assert ours["speedup"]["liger"] is None and "CUDA" in ours["speedup_note"]["liger"]
    both = _by(rows, "speedlight", "fwd+bwd")
    assert both["bytes"] == 2 * ours["bytes"]  # forward + backward Costs


def test_speedup_is_withheld_for_a_case_that_fails_verification():
    rows = _bench().case_rows(WRONG, WRONG.cases("quick")[0])
    ours = _by(rows, "speedlight", "fwd")
    assert ours["status"] == "ok", "the case is still timed"
    assert ours["verified"] is False and ours["verify_status"] == "fail"
    assert ours["speedup"]["torch-eager"] is None
    assert "not verified" in ours["speedup_note"]["torch-eager"]


def test_no_verify_means_no_speedup():
    rows = _bench(verify=False).case_rows(TOY, TOY.cases("quick")[0])
    ours = _by(rows, "speedlight", "fwd")
    assert ours["verified"] is None and ours["speedup"]["torch-eager"] is None


def test_bwd_times_only_the_backward():
    rule = StopRule(target_rse=0.5, min_samples=3, max_samples=3, time_cap_s=0.0,
                    warmup_calls=1, warmup_s=0.0)
    bench = Bench("cpu", Settings(rule=rule, verify=False), Baselines(()))
    rows = bench.case_rows(SLOW, SLOW.cases("quick")[0])
    fwd, bwd, both = (_by(rows, "speedlight", m)["median_us"] * 1e-6 for m in runner.MODES)
    assert fwd >= toy_specs.FWD_S and both >= toy_specs.FWD_S + toy_specs.BWD_S
    assert bwd >= toy_specs.BWD_S
    assert bwd < toy_specs.FWD_S / 2, "the backward timing included the forward"


def test_a_baseline_that_computes_something_else_is_not_timed():
    bench = _bench(baselines=("torch-eager",))
    off = dataclasses.replace(TOY, reference=lambda x, alpha: x * alpha)
    case = TOY.cases("quick")[0]
    inputs = TOY.make_inputs(case, "cpu")
    impls = bench.baselines.for_case(off, case, inputs, "cpu")
    impls[1].checked = True
    impls[1].fn = lambda x, alpha: x * alpha + 1.0
    copies = [inputs]
    row = bench.timer.time(impls[1], off, case, "fwd", copies, None, [], off.reference(**inputs), False)
    assert row["status"] == "unavailable" and "does not compute toy_scale" in row["reason"]


def test_an_implementation_that_writes_its_inputs_gets_them_restored():
    seen = []

    def clobber(x, alpha):
        seen.append(float(x.flatten()[0]))
        x.add_(100.0)
        return x * alpha

    bench = _bench(baselines=())
    case = TOY.cases("quick")[0]
    inputs = TOY.make_inputs(case, "cpu")
    impl = Contender("speedlight", clobber, mutates_inputs=True)
    row = bench.timer.time(impl, TOY, case, "fwd", [inputs], TOY.make_inputs(case, "cpu"), [],
                       None, False)
    assert row["status"] == "ok"
    assert len(set(seen)) == 1, "every call must see the original inputs"


def test_skips_say_why():
    bench = _bench(cpu_max_bytes=64)
    big = Case("toy_scale", {"rows": 64, "cols": 64})
    (row, *_) = bench.case_rows(TOY, big)
    assert row["status"] == "skip" and "too large for the Triton interpreter" in row["reason"]
    empty = Case("toy_scale", {"rows": 0, "cols": 8})
    assert all(r["status"] == "skip" and "empty" in r["reason"] for r in bench.case_rows(TOY, empty))
    half = Case("toy_scale", {"rows": 2, "cols": 8}, dtype=torch.float64)
    assert "does not support fp64" in bench.case_rows(TOY, half)[0]["reason"]


def test_budget_skips_the_cases_not_started_in_time():
    clock = iter(range(0, 10**6, 10))  # every reading of the wall clock is 10 s later
    bench = Bench("cpu", Settings(rule=FAST, verify=False), Baselines(()), wall=lambda: next(clock))
    bench.timer.clock = clock_for(torch.device("cpu"))
    rows = bench.run([TOY], lambda spec: spec.cases("quick"), budget_s=5.0)
    reasons = {r["case_id"]: r["reason"] for r in rows if r["implementation"] == "speedlight"}
    assert len(reasons) == 2
    assert all("budget" in why for why in reasons.values())


def test_spread_order_is_a_permutation_whose_prefixes_cover_the_range():
    for n in (1, 2, 5, 8, 37):
        order = runner.spread_order(n)
        assert sorted(order) == list(range(n))
    first = runner.spread_order(37)[:4]
    assert first[0] == 0 and max(first) >= 24 and min(abs(a - b) for a in first for b in first if a != b) >= 8


def test_torch_compile_baseline_is_timed_and_checked():
    bench = _bench(baselines=("torch-compile",))
    bench.baselines = Baselines(("torch-compile",), CompileOptions(backend="aot_eager"))
    rows = bench.case_rows(TOY, TOY.cases("quick")[0])
    compiled = _by(rows, "torch-compile", "fwd+bwd")
    assert compiled["status"] == "ok", compiled["reason"]
    assert _by(rows, "speedlight", "bwd")["speedup"]["torch-compile"] is not None


def test_interrupted_run_keeps_the_cases_already_written(tmp_path, monkeypatch):
    spec_file = str(toy_specs.__file__)
    calls = {"n": 0}
    real = Bench.case_rows

    def interrupt_second(self, spec, case):
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(self, spec, case)

    monkeypatch.setattr(Bench, "case_rows", interrupt_second)
    code = cli.main(["bench", "--spec", spec_file, "--only-spec", "--suite", "quick",
                     "--dtypes", "fp32", "--baselines", "torch-eager", "--out", str(tmp_path),
                     "--time-cap", "0.01", "--max-samples", "3"])
    assert code == 130
    rows = results.read_jsonl(tmp_path / "bench.jsonl")
    assert rows and {r["case_id"] for r in rows} == {TOY.cases("quick")[0].with_(dtype=torch.float32).id}
    assert not list(tmp_path.glob(".*.tmp")), "no temporary file left behind"


def test_memory_estimate_counts_allocated_inputs_not_traffic():
    """Attention's Cost counts K/V re-reads per query block; sizing counts the tensors
    allocated, so the 8K-token bf16 headline case fits a 32 GiB budget (on an H200 it was
    skipped as needing 68 GiB)."""
    import dataclasses
    import types

    import torch

    from speedlight import registry
    from speedlight.bench.sizing import CaseSizing, input_bytes

    spec = next(s for s in registry.builtin_specs() if s.name == "attention")
    case = next(c for c in spec.suites["model"]()
                if "seq_q8192-seq_k8192-dim128" in c.id and c.flag("causal"))
    case = dataclasses.replace(case, dtype=torch.bfloat16)
    b, h, hkv, s, d = (case[k] for k in ("batch", "heads", "kv_heads", "seq_q", "dim"))
    assert input_bytes(spec, case) == 2 * b * s * d * (h + 2 * hkv)  # q, k, v in bf16
    sizing = CaseSizing(torch.device("cpu"), types.SimpleNamespace(max_bytes=32 * 2 ** 30))
    assert sizing._bytes_needed(spec, case, 1) < 32 * 2 ** 30 < spec.cost(case, "fwd").bytes * 4
