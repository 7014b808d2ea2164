"""The performance model on loop bodies whose cost is known by hand (no compile), loop trip
counts followed through TTIR, and the predictions of the deliberate loop kernels."""

from types import SimpleNamespace

import pytest
import torch

from speedlight import predict
from speedlight.inspect import trips
from speedlight.inspect.specialise import Arg
from speedlight.target import resolve

# the deliberate kernels compile once with test_loops' (one worker, the session's compiler)
pytestmark = pytest.mark.xdist_group("findings")

H200 = resolve("sm_90a", sku="h200").sku
Op = predict.Op


def chain(n, pipe="fma"):
    """n instructions, each reading the one before."""
    return [Op(pipe, (f"R{i + 1}",), (f"R{i}",)) for i in range(n)]


def independent(n, pipe="fma"):
    return [Op(pipe, (f"R{100 + i}",), ("R0",)) for i in range(n)]


def test_a_dependent_chain_costs_its_latency_and_independent_work_its_issue():
    lat = predict.LATENCY["fma"]
    # one warp: 64 dependent FMAs take 64 latencies per iteration
    assert predict.simulate(chain(64), programs=1, warps_per_program=1, sku=H200) == \
        pytest.approx(64 * lat, rel=0.05)
    # 16 warps on 4 schedulers, 64 independent FMAs each: 4 warps x 64 issue slots per scheduler
    assert predict.simulate(independent(64), programs=1, warps_per_program=16, sku=H200) == \
        pytest.approx(4 * 64, rel=0.05)
    # MUFU issues at 16 lanes a cycle per SM: 8 cycles a warp-instruction per scheduler
    assert predict.simulate(independent(32, "mufu"), programs=1, warps_per_program=4,
                            sku=H200) == pytest.approx(32 * 8, rel=0.05)


def test_mma_queues_on_the_tensor_cores_and_a_wait_exposes_it():
    flops = 2 * 64 * 64 * 16  # one HGMMA.64x64x16 of a warp group: a quarter per warp
    body = [Op("mma", ("R8",), (), "mma", flops // 4) for _ in range(7)] + \
        [Op("mma", ("R8",), (), "mma_commit", flops // 4), Op("control", (), (), "mma_wait")]
    rate = predict.tensor_rate(H200, "bf16")
    # 8 warps (two warp groups) x 8 quarter-MMAs queue on the SM's tensor cores
    assert predict.simulate(body, programs=1, warps_per_program=8, sku=H200) == \
        pytest.approx(8 * 8 * (flops // 4) / rate, rel=0.1)


def test_a_load_used_at_once_waits_the_memory_latency_and_a_prefetch_hides_it():
    mem = 1000.0
    used_now = [Op("memory", ("R4",), ("R2",), "load"), Op("fma", ("R5",), ("R4",))]
    assert predict.simulate(used_now, programs=1, warps_per_program=1, sku=H200,
                            memory_cycles=mem) == pytest.approx(mem + 4, rel=0.05)
    # the load's value is used one iteration later (R6 holds last iteration's): hidden
    ahead = [Op("fma", ("R5",), ("R6",)), Op("memory", ("R6",), ("R2",), "load")] + chain(300)
    got = predict.simulate(ahead, programs=1, warps_per_program=1, sku=H200,
                           memory_cycles=mem, iterations=4)
    assert got < 300 * 4 + 50 and got < mem + 300 * 4


def test_a_launch_is_its_waves_and_bandwidth_bounds_a_byte_heavy_loop():
    seg = predict.Segment(chain(4), trips_mean=10, trips_most=10, instructions=4,
                          bytes_per_thread=1 << 14)
    f = predict.LaunchFigures(programs=H200.sm_count * 2, num_warps=4, warp_size=32, resident=1,
                              segments=[seg])
    p = predict.predict_launch(f, H200, bandwidth=4e12)
    assert p.bound == "memory" and p.parts["waves"] == 2
    per_sm_cycle = 4e12 / H200.sm_count / predict.clock_hz(H200)
    mem = 128 * (1 << 14) / per_sm_cycle
    assert p.parts["cycles"] == pytest.approx(2 * 10 * mem, rel=0.01)
    assert p.seconds == pytest.approx(p.parts["cycles"] / predict.clock_hz(H200)
                                      + predict.LAUNCH_S["stream"])
    tiny = predict.LaunchFigures(1, 1, 32, 1, [predict.Segment(chain(2), 1, 1, 2)])
    assert predict.predict_launch(tiny, H200, launch="graph").bound == "launch"


TTIR = """
#loc1 = loc("/k.py":10:4)
#loc2 = loc("/k.py":12:8)
module {
  tt.func public @k(%x_ptr: !tt.ptr<f32> {tt.divisibility = 16 : i32} loc("x_ptr"(#loc)), %n: i32 loc("n"(#loc)), %flag_ptr: !tt.ptr<f32> loc("f"(#loc))) attributes {noinline = false} {
    %c0_i32 = arith.constant 0 : i32 loc(#loc)
    %c64_i32 = arith.constant 64 : i32 loc(#loc)
    %0 = tt.get_program_id x : i32 loc(#loc)
    %1 = arith.muli %0, %c64_i32 : i32 loc(#loc)
    %2 = arith.cmpi sge, %1, %n : i32 loc(#loc)
    cf.cond_br %2, ^bb1, ^bb2 loc(#loc)
  ^bb1:  // pred: ^bb0
    tt.return loc(#loc)
  ^bb2:  // pred: ^bb0
    %3 = arith.addi %1, %c64_i32 : i32 loc(#loc)
    %4 = arith.minsi %3, %n : i32 loc(#loc)
    scf.for %i = %1 to %4 step %c64_i32  : i32 {
      scf.for %j = %c0_i32 to %i step %c64_i32  : i32 {
        %5 = arith.addi %i, %j : i32 loc(#loc)
      } loc(#loc2)
    } loc(#loc1)
    tt.return loc(#loc)
  } loc(#loc)
} loc(#loc)
"""


def test_trips_follow_the_bounds_through_the_ttir():
    launch = SimpleNamespace(args=[Arg("x_ptr", "tensor"), Arg("n", "int", 200),
                                   Arg("flag_ptr", "tensor")], grid=(5, 1, 1))
    outer, inner = trips.loop_trips(TTIR, launch)
    assert (outer.line, inner.line) == (10, 12)
    # programs 0..3 run one outer iteration each (200 rows in 64s), program 4 returns early
    assert outer.mean == pytest.approx(4 / 5) and outer.most == 1
    # program p's inner loop runs p times (j over 0..64p in steps of 64)
    assert inner.mean == pytest.approx((0 + 1 + 2 + 3) / 5) and inner.most == 3
    unknown = trips.loop_trips(TTIR.replace("%4 = arith.minsi %3, %n", "%4 = tt.load %flag_ptr"),
                               launch)
    assert not unknown[0].known and "memory" in unknown[0].why


def test_the_deliberate_row_loops_are_predicted(compiler):
    from speedlight.inspect.run import inspect_cases
    from speedlight.spec import Case
    from tests.inspect.loop_kernels import ROWS

    cases = [Case("rows", {"rows": 64}, dtype=torch.float32, flags={"prefetch": p})
             for p in (False, True)]
    plain, ahead = (r.kernels[0].predicted for r in inspect_cases(
        [(ROWS, c) for c in cases], resolve("sm_90a", sku="h200"), compiler=compiler,
        mode="dry"))
    assert plain is not None and ahead is not None
    (loop_plain, _), (loop_ahead, _) = plain.parts["segments"][:2], ahead.parts["segments"][:2]
    # 4 programs over 64 rows: 16 rows a program
    assert loop_plain["trips_mean"] == loop_ahead["trips_mean"] == 16
    assert loop_plain["bound"] == "memory-latency" and loop_ahead["cycles"] < loop_plain["cycles"]
    assert ahead.seconds < plain.seconds
