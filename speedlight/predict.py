"""Predicted: what a compiled kernel will cost on a GPU, from its code alone (no GPU).

The figures come from inspect (loops.Loop per kernel: instructions per iteration by pipe,
MMA FLOPs, bytes and bytes in flight; occupancy and waves); this module holds the GPU's
side (how fast each pipe issues, how long a result takes, how much memory must be in
flight) and the model that turns the figures into a time and names what bounds it. Every
number it gives is a prediction, labelled so wherever it is shown.

The GPU's rates come from hardware.DeviceSpec (datasheet peaks, bandwidth) and, where
present, the ceilings `speedlight probe` measured; the per-SM rates of each pipe from the
CUDA C++ Programming Guide's table of arithmetic instruction throughput; the SM clock is
the one the datasheet's dense tensor peak implies (peak / (SMs x tensor FLOPs per SM per
cycle)). The constants no datasheet gives (the memory latency a loaded GPU shows, the cost
of a launch) are set from measured rows, which the validation (`scripts/predict_rows.py`)
keeps apart from the rows it checks.
"""

from __future__ import annotations

from dataclasses import dataclass

from speedlight.hardware import DeviceSpec

# Dense 16-bit tensor-core FLOPs per SM (CU) per cycle, by architecture: A100 312 TFLOP/s
# at 108 SMs x 1410 MHz; H100 SXM 989.4 at 132 x 1830 MHz; B200 2250 at 148 SMs; L4
# (sm_89) 121 at 58 x 2040 MHz; MI300X 1307.4 at 304 CUs x 2100 MHz; MI355X 2516.6 at 256 x
# 2400 MHz. Other operand types scale with their datasheet peaks.
TENSOR_FLOPS_PER_CYCLE = {8: 2048, 9: 4096, 10: 8192, 12: 4096, "gfx942": 2048,
                          "gfx950": 4096}
TENSOR_FLOPS_PER_CYCLE_SM89 = 1024

# Warp-instructions one SM issues per cycle to each pipe (results per clock per SM in the
# CUDA C++ Programming Guide's throughput table, divided by the warp's 32 lanes), for
# compute capability 8.0 to 10.0: 32-bit floating add/multiply/fma 128 (64 on 8.0);
# integer add, compare, min/max, shift, logic 64; 32-bit integer multiply-add 64;
# exp2/rsqrt/rcp (MUFU) 16; conversions 16; warp shuffle 32. The uniform datapath issues
# beside the vector one (counted as ALU); a memory instruction takes one issue slot of its
# sub-partition's load/store unit (32 lanes of address per cycle per SM: 1 per cycle).
PIPE_RATE = {"fma": 4.0, "alu": 2.0, "select": 2.0, "mufu": 0.5, "convert": 0.5,
             "shuffle": 1.0, "memory": 1.0, "uniform": 4.0, "control": 4.0, "barrier": 4.0,
             "other": 2.0, "mma": 4.0}
PIPE_RATE_SM80 = dict(PIPE_RATE, fma=2.0)
# An AMD CU: four SIMDs of 16 lanes, so a wave's vector instruction takes 4 cycles of one
# SIMD; scalar and branch instructions 1 cycle of the CU's scalar unit.
AMD_VECTOR_CYCLES = 4

# Warp schedulers (sub-partitions) per SM: one instruction issued per cycle each.
SCHEDULERS = 4

# Cycles from an instruction's issue until a dependent one may issue, per pipe (the
# dependent-issue latencies microbenchmarks of Ampere and Hopper report: about 4 for
# FP32 and integer arithmetic, 15-20 for MUFU, about 30 for a shuffle or a shared-memory
# load); a global load's is the memory latency below.
LATENCY = {"fma": 4, "alu": 4, "select": 4, "uniform": 2, "mufu": 18, "convert": 6,
           "shuffle": 28, "memory": 30, "control": 1, "barrier": 20, "other": 4, "mma": 0}

# The latency of a DRAM load on an idle memory system, in nanoseconds (a busy one queues:
# predict_launch divides it by 1 - the share of bandwidth drawn): a model constant set from
# a measured memory-bound row of an H200 (scripts/predict_rows.py); no datasheet gives it.
# No AMD row has set the AMD one: it is the H200's.
MEMORY_LATENCY_NS = {"nvidia": 258.2, "amd": 258.2}


def tensor_flops_per_cycle(sku: DeviceSpec) -> int:
    """Dense 16-bit tensor FLOPs per SM per cycle of the SKU's architecture."""
    if sku.vendor == "amd":
        return TENSOR_FLOPS_PER_CYCLE[sku.gfx.split(":")[0]]
    major, minor = sku.compute_capability
    if (major, minor) == (8, 9):
        return TENSOR_FLOPS_PER_CYCLE_SM89
    return TENSOR_FLOPS_PER_CYCLE.get(major, 4096)


def clock_hz(sku: DeviceSpec) -> float:
    """The SM clock the datasheet's dense 16-bit tensor peak implies."""
    peak = sku.peak_flops.get("bf16") or sku.peak_flops.get("fp16")
    return peak / (sku.sm_count * tensor_flops_per_cycle(sku))


def memory_latency_s(sku: DeviceSpec) -> float:
    return MEMORY_LATENCY_NS[sku.vendor] * 1e-9


def needed_in_flight(sku: DeviceSpec, bandwidth: float | None = None) -> int:
    """Bytes each SM must keep in flight to draw MAX_BUSY of the GPU's DRAM bandwidth
    (Little's law: that rate per SM x the latency a load takes at that rate, the idle
    latency over 1 - MAX_BUSY)."""
    bandwidth = bandwidth or sku.dram_bandwidth
    return int(MAX_BUSY * bandwidth / sku.sm_count * loaded_latency_s(sku))


def loaded_latency_s(sku: DeviceSpec) -> float:
    """The latency of a load while the memory system delivers MAX_BUSY of its bandwidth."""
    return memory_latency_s(sku) / (1.0 - MAX_BUSY)


# --- the model --------------------------------------------------------------------------

@dataclass(frozen=True)
class Op:
    """One instruction of a loop body as the model sees it: the pipe it issues to, the
    registers it writes and reads, and what it waits for or starts:
      ""           an ordinary instruction (its result after LATENCY[pipe] cycles)
      "load"       a global load (its result after the memory latency)
      "mma"        an asynchronous MMA of `flops` on the SM's tensor cores (wgmma, tcgen05)
      "mma_commit" the same, closing this warp's MMA group (wgmma's gsb0)
      "mma_wait"   wait until at most `keep` of this warp's MMA groups are pending
                   (WARPGROUP.DEPBAR.LE gsb0, keep)
      "copy"       an asynchronous global-to-shared copy (cp.async, TMA) of `bytes`
      "commit"     close this warp's copy group (LDGDEPBAR)
      "copy_wait"  wait until at most `keep` of this warp's copy groups are pending
      "sync_wait"  wait for the copies this warp issued `stages - 1` iterations before (an
                   mbarrier wait on a pipeline stage: a loop pipelined over S stages issues
                   each iteration's copies S - 1 iterations ahead; those before the loop
                   are taken as arrived)
      "barrier"    wait for every warp of the program (BAR.SYNC)"""

    pipe: str
    writes: tuple = ()
    reads: tuple = ()
    kind: str = ""
    flops: int = 0
    keep: int = 0


def pipe_rates(sku: DeviceSpec) -> dict:
    if sku.vendor == "amd":  # a wave's vector op holds one of the 4 SIMDs for 4 cycles
        return {p: (1.0 if p in ("uniform", "control", "barrier") else
                    SCHEDULERS / AMD_VECTOR_CYCLES) for p in PIPE_RATE}
    return PIPE_RATE_SM80 if sku.compute_capability[0] == 8 else PIPE_RATE


def tensor_rate(sku: DeviceSpec, dtype: str) -> float:
    """Dense tensor FLOPs per SM per cycle in `dtype` (the 16-bit rate scaled by the
    datasheet's peaks)."""
    base = sku.peak_flops.get("bf16") or sku.peak_flops.get("fp16")
    peak = sku.peak_flops.get(dtype) or sku.peak_flops.get("fp16") or base
    return tensor_flops_per_cycle(sku) * peak / base


_SIMULATED: dict = {}  # (body, arguments) -> cycles: one compiled kernel serves many launches
_SIMULATED_MOST = 4096


def simulate(body: list[Op], *, programs: int, warps_per_program: int, sku: DeviceSpec,
             dtype: str = "bf16", iterations: int = 3, memory_cycles: float | None = None,
             stages: int = 1, tensor_scale: float = 1.0) -> float:
    """_simulate, remembered: the same loop body at the same residency on the same GPU is
    simulated once however many launches share it."""
    key = (tuple(body), programs, warps_per_program, sku.key, dtype, iterations, memory_cycles,
           stages, tensor_scale)
    if key not in _SIMULATED:
        if len(_SIMULATED) >= _SIMULATED_MOST:
            _SIMULATED.clear()
        _SIMULATED[key] = _simulate(body, programs=programs, warps_per_program=warps_per_program,
                                    sku=sku, dtype=dtype, iterations=iterations,
                                    memory_cycles=memory_cycles, stages=stages,
                                    tensor_scale=tensor_scale)
    return _SIMULATED[key]


def _simulate(body: list[Op], *, programs: int, warps_per_program: int, sku: DeviceSpec,
             dtype: str = "bf16", iterations: int = 3, memory_cycles: float | None = None,
             stages: int = 1, tensor_scale: float = 1.0) -> float:
    """Cycles one SM takes per iteration of a loop when `programs` programs of
    `warps_per_program` warps each run it together: warps issue in order, one instruction
    per cycle per scheduler (warp w on scheduler w % 4), each pipe at its rate, an
    instruction waiting for the registers it reads, MMAs queued on the SM's tensor cores,
    loads and copies arriving after the memory latency, barriers waiting for the program's
    warps. Memory bandwidth is not modelled here (see predict_launch)."""
    if not body:
        return 0.0
    rates = pipe_rates(sku)
    busy_for = {p: SCHEDULERS / r for p, r in rates.items()}  # cycles a scheduler's pipe is held
    lat = dict(LATENCY)
    mem = memory_cycles if memory_cycles is not None else \
        memory_latency_s(sku) * clock_hz(sku)
    mma_rate = tensor_rate(sku, dtype) * tensor_scale
    warps = programs * warps_per_program
    n = len(body)
    total = n * iterations
    pc = [0] * warps
    ready: list[dict] = [{} for _ in range(warps)]
    mma_groups: list[list] = [[] for _ in range(warps)]  # completion of each MMA group
    mma_open = [0.0] * warps  # completion of this warp's MMAs not yet in a group
    groups: list[list] = [[] for _ in range(warps)]  # completion cycle of each copy group
    open_copies = [0.0] * warps  # latest completion of the copies of the open group
    by_iteration: list[dict] = [{} for _ in range(warps)]  # iteration -> its copies' arrival
    ahead = max(stages - 1, 0)
    at_barrier: dict[tuple, list] = {}  # (program, occurrence) -> warps arrived
    released = [0.0] * warps  # when a warp waiting at a barrier may go on
    waiting = [False] * warps
    bar_count = [0] * warps
    pipe_free = [dict.fromkeys(rates, 0.0) for _ in range(SCHEDULERS)]
    tensor_free = 0.0
    finished: list[list] = [[] for _ in range(warps)]  # cycle each iteration ended
    by_sched = [[w for w in range(warps) if w % SCHEDULERS == s] for s in range(SCHEDULERS)]
    start = [0] * SCHEDULERS
    t = 0.0
    done = 0
    while done < warps:
        issued_any = False
        soonest = float("inf")
        for s in range(SCHEDULERS):
            ws = by_sched[s]
            if not ws:
                continue
            k = len(ws)
            for j in range(k):
                w = ws[(start[s] + j) % k]
                if pc[w] >= total:
                    continue
                if waiting[w]:
                    soonest = min(soonest, released[w]) if released[w] else soonest
                    if not released[w] or released[w] > t:
                        continue
                    waiting[w] = False
                op = body[pc[w] % n]
                p = w // warps_per_program
                at = max([ready[w].get(r, 0.0) for r in op.reads] + [pipe_free[s][op.pipe]])
                if op.kind == "mma_wait":
                    pending = sorted(mma_groups[w] + ([mma_open[w]] if mma_open[w] > t else []))
                    if len(pending) > op.keep:
                        at = max(at, pending[len(pending) - op.keep - 1])
                elif op.kind == "copy_wait":
                    pending = sorted(groups[w])
                    if len(pending) > op.keep:
                        at = max(at, pending[len(pending) - op.keep - 1])
                elif op.kind == "sync_wait":
                    at = max(at, by_iteration[w].get(pc[w] // n - ahead, 0.0))
                if at > t:
                    soonest = min(soonest, at)
                    continue
                # issue
                pipe_free[s][op.pipe] = t + busy_for.get(op.pipe, 1.0)
                if op.kind == "load":
                    done_at = t + mem
                elif op.kind in ("mma", "mma_commit"):
                    begin = max(t, tensor_free)
                    tensor_free = begin + op.flops / mma_rate
                    done_at = tensor_free
                    mma_open[w] = max(mma_open[w], done_at)
                    if op.kind == "mma_commit":
                        mma_groups[w] = [g for g in mma_groups[w] if g > t] + [mma_open[w]]
                        mma_open[w] = 0.0
                elif op.kind == "copy":
                    open_copies[w] = max(open_copies[w], t + mem)
                    it = pc[w] // n
                    by_iteration[w][it] = max(by_iteration[w].get(it, 0.0), t + mem)
                    done_at = t + lat.get(op.pipe, 4)
                elif op.kind == "commit":
                    groups[w] = [g for g in groups[w] if g > t] + [open_copies[w] or t + mem]
                    open_copies[w] = 0.0
                    done_at = t + 1
                elif op.kind == "sync_wait":
                    done_at = t + lat.get(op.pipe, 4)
                else:
                    done_at = t + lat.get(op.pipe, 4)
                for r in op.writes:
                    ready[w][r] = done_at
                if op.kind == "copy_wait":
                    groups[w] = [g for g in groups[w] if g > t]
                elif op.kind == "mma_wait":
                    mma_groups[w] = [g for g in mma_groups[w] if g > t]
                pc[w] += 1
                if pc[w] % n == 0:
                    finished[w].append(t)
                    if pc[w] >= total:
                        done += 1
                if op.kind == "barrier":
                    key = (p, bar_count[w])
                    bar_count[w] += 1
                    arrived = at_barrier.setdefault(key, [])
                    arrived.append(w)
                    waiting[w] = True
                    released[w] = 0.0
                    if len(arrived) == warps_per_program:
                        for x in arrived:
                            released[x] = t + lat["barrier"]
                        soonest = min(soonest, t + lat["barrier"])
                        del at_barrier[key]
                start[s] = (start[s] + j + 1) % k
                issued_any = True
                break
        if done >= warps:
            break
        if issued_any:
            t += 1.0
        elif soonest == float("inf"):
            break  # nothing can go on (a barrier some warp never reaches): stop
        else:
            t = max(t + 1.0, float(int(soonest)) if soonest == int(soonest) else soonest)
    # a round ends when the last warp ends its iteration: the rounds' spacing is the cost
    rounds = [max(f[k] for f in finished) for k in range(min(len(f) for f in finished))] \
        if finished and all(finished) else []
    if len(rounds) >= 2:
        return (rounds[-1] - rounds[0]) / (len(rounds) - 1)
    return max((f[-1] for f in finished if f), default=t) / max(iterations, 1)


# Fixed costs of a launch no loop explains (the launch itself, the grid's start and drain),
# in seconds: model constants set from measured rows (scripts/predict_rows.py keeps the rows
# that set them apart). "graph": a launch replayed from a CUDA graph; "stream": one launched
# from the host, timed with events.
LAUNCH_S = {"graph": 1.303e-6, "stream": 6.784e-6}
# An SM draws at most this many bytes of DRAM traffic per cycle when few SMs are busy.
SM_BYTES_PER_CYCLE = 64.0
# tensor, issue (the schedulers' slots), memory (DRAM bandwidth), memory-latency (waiting on
# DRAM loads: too few bytes in flight), latency (chains of dependent instructions, waits),
# launch (the fixed cost of a launch)
BOUNDS = ("tensor", "issue", "memory", "memory-latency", "latency", "launch")


@dataclass
class Prediction:
    """A kernel launch's predicted time on a GPU and what bounds it (every figure
    predicted from compiled code, never measured)."""

    seconds: float
    bound: str  # one of BOUNDS
    parts: dict  # cycles and inputs behind it
    note: str = ""

    @property
    def us(self) -> float:
        return self.seconds * 1e6

    def to_json(self) -> dict:
        return {"us": round(self.us, 3), "bound": self.bound, "predicted": True,
                "parts": self.parts, **({"note": self.note} if self.note else {})}


@dataclass(frozen=True)
class Segment:
    """Code a program runs `trips_mean` times (a loop's body, or the code outside every
    loop: once): its instructions as Ops, and the figures the bound is named from."""

    ops: list
    trips_mean: float
    trips_most: float
    instructions: int = 0
    mma_flops: int = 0
    mma_dtype: str = "bf16"
    bytes_per_thread: int = 0  # global bytes a thread loads and stores per pass (LDG, STG, cp.async)
    where: str = ""  # file:line of a loop ('' outside loops)
    stages: int = 1  # pipeline stages its copies rotate through (mbarrier waits)


@dataclass(frozen=True)
class LaunchFigures:
    """What the model needs of one launch (built by inspect from the compiled kernel)."""

    programs: int
    num_warps: int
    warp_size: int
    resident: int  # programs per SM the resources allow
    segments: list  # Segment: each loop, and the code outside them


def predict_launch(f: LaunchFigures, sku: DeviceSpec, *, bandwidth: float | None = None,
                   launch: str = "stream", memory_latency_ns: float | None = None,
                   matmul_flops: float | None = None, launch_s: dict | None = None
                   ) -> Prediction:
    """The time of one launch: per SM, `resident` programs run each segment together
    (simulate: issue, pipes, tensor cores, latencies, barriers) or as fast as the SM's
    share of DRAM bandwidth carries their bytes, whichever is slower; a program runs each
    loop trips_mean times and the code outside loops once; the grid runs in waves of SMs x
    resident programs, and no launch ends before its longest program (trips_most); the
    launch's fixed cost is added. The bound is the one of the segment that takes longest.

    A load waits longer the busier the memory system is: the idle latency over (1 - u), u
    the share of bandwidth the launch itself draws, which depends on the time it predicts:
    each segment is simulated at the idle latency and twice it (its cycles grow about
    linearly with the latency), and u is the fixed point of u = bytes / (time(u) x
    bandwidth), at most MAX_BUSY. `bandwidth` and `matmul_flops` (bf16) are the probe's
    measured ceilings where known (they replace the datasheet's); `memory_latency_ns`
    (idle) and `launch_s` the model's constants."""
    clock = clock_hz(sku)
    bandwidth = bandwidth or sku.dram_bandwidth
    scale = matmul_flops / (sku.peak_flops.get("bf16") or matmul_flops) if matmul_flops else 1.0
    idle = round((memory_latency_ns * 1e-9 if memory_latency_ns else memory_latency_s(sku))
                 * clock)
    sms = sku.sm_count
    programs = max(f.programs, 1)
    per_sm = max(1, min(f.resident or 1, -(-programs // sms)))
    busy_sms = min(sms, -(-programs // per_sm))
    sm_bytes_per_cycle = min(bandwidth / busy_sms / clock, SM_BYTES_PER_CYCLE)
    threads = f.num_warps * f.warp_size
    waves = -(-programs // (busy_sms * per_sm))
    fixed = (launch_s or LAUNCH_S)[launch]
    segs, moved = [], 0.0
    for seg in f.segments:
        if seg.trips_mean <= 0 and seg.trips_most <= 0:
            continue
        looped = seg.trips_most > 1
        kw = dict(programs=per_sm, warps_per_program=f.num_warps, sku=sku, dtype=seg.mma_dtype,
                  stages=seg.stages, iterations=max(3, seg.stages + 2) if looped else 1,
                  tensor_scale=scale)
        at_idle = simulate(seg.ops, memory_cycles=idle, **kw) if seg.ops else 0.0
        at_twice = simulate(seg.ops, memory_cycles=2 * idle, **kw) if seg.ops else 0.0
        slope = max(at_twice - at_idle, 0.0) / idle if idle else 0.0  # cycles per latency cycle
        mem = per_sm * threads * seg.bytes_per_thread / sm_bytes_per_cycle
        moved += seg.trips_mean * threads * seg.bytes_per_thread * programs
        segs.append((seg, at_idle - slope * idle, slope, mem))

    def cycles_at(latency: float) -> float:
        mean = sum(s.trips_mean * max(a + b * latency, m) for s, a, b, m in segs)
        most = sum(s.trips_most * max(a + b * latency, m) for s, a, b, m in segs)
        return max(waves * mean, most)

    def drawn(u: float) -> float:  # the share of bandwidth the launch draws at busy u
        c = cycles_at(idle / (1.0 - u))
        return moved / (c / clock * bandwidth) if c else 0.0

    lo, hi = 0.0, MAX_BUSY
    if drawn(hi) >= hi:
        lo = hi
    else:
        for _ in range(30):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if drawn(mid) > mid else (lo, mid)
    busy = lo
    latency = idle / (1.0 - busy)
    cycles = cycles_at(latency)
    seconds = cycles / clock + fixed
    worst, parts_segs = None, []
    for seg, a, b, mem in segs:
        sim = a + b * latency
        one = max(sim, mem)
        issue = per_sm * f.num_warps * seg.instructions / SCHEDULERS
        tensor = per_sm * seg.mma_flops / (tensor_rate(sku, seg.mma_dtype) * scale) \
            if seg.mma_flops else 0.0
        if mem >= sim:
            bound = "memory"
        elif sim <= 1.15 * max(issue, tensor):
            bound = "tensor" if tensor >= issue else "issue"
        elif seg.bytes_per_thread and b * latency > 0.4 * sim:
            bound = "memory-latency"  # waiting on DRAM loads: too few bytes in flight
        else:
            bound = "latency"
        parts_segs.append({"where": seg.where or "outside loops",
                           "trips_mean": round(seg.trips_mean, 3), "trips_most": seg.trips_most,
                           "cycles": round(one, 1), "simulated": round(sim, 1),
                           "bandwidth": round(mem, 1), "issue": round(issue, 1),
                           "tensor": round(tensor, 1), "bound": bound})
        if worst is None or seg.trips_mean * one > worst[0]:
            worst = (seg.trips_mean * one, bound)
    bound = "launch" if fixed >= 0.5 * seconds or worst is None else worst[1]
    parts = {"clock_mhz": round(clock / 1e6), "programs_per_sm": per_sm, "busy_sms": busy_sms,
             "waves": waves, "cycles": round(cycles), "launch_us": round(fixed * 1e6, 3),
             "memory_latency_cycles": round(latency), "idle_latency_cycles": idle,
             "bandwidth_share": round(busy, 3), "bytes": round(moved), "segments": parts_segs}
    return Prediction(seconds, bound, parts)


# The share of bandwidth at which the queueing of loads is held (the bandwidth bound takes
# over beyond it)
MAX_BUSY = 0.8
