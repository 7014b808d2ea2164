"""The sweep of `speedlight tune`: tasks, and the one function that runs a task.

A Task is one shape (a Case of the op's suite) and the op's configuration space; running
it (`run_task`) gives one row per configuration examined:

The space swept is the op's for the target (Configs.space_for): an AMD target's adds
Triton's HIP knobs (waves_per_eu, matrix_instr_nonkdim, kpack for the GEMMs), ordered and
pruned as every other parameter is; an NVIDIA target's is the declared space.

1. capture: the op runs on the case's inputs with no launch executed (inspect's recorder,
   mode "dry"), sized for the target's SKU, once under the launch rule (what runs today,
   and the shape bucket the launcher asks a configuration for) and once per candidate,
   the candidate forced through launch.forcing. Candidates go nearest the rule
   first (one parameter changed, then two...), each parameter changed in turn, so a
   capped sweep still moves every parameter. A candidate whose launches are exactly an
   earlier one's (same compiled kernel, same grid) is a duplicate, not compiled again.
2. prune without a GPU: at most `max_compiles` distinct kernels are compiled for the
   target's arch (inspect's TritonCompiler: once per distinct specialisation, in worker
   processes, Triton's disk cache behind it), and each is read as inspect reads it;
   a candidate is rejected, with inspect's own message, when a kernel does not compile,
   spills (unless its KernelDesign allows it), needs more shared memory than one block
   may have, keeps fewer pipeline stages or a lower theoretical occupancy than its
   KernelDesign. Candidates left over the cap get one row that counts them.
3. on the GPU (when it is the target): the survivors and the rule are timed with bench's
   timer (forward, no gradient, L2 flushed between samples); the fastest is verified
   with verify's harness (forward and backward against float64) before it is accepted,
   the next fastest tried if it fails. Its row says "best"; `winners(rows)` turns rows
   into tuned-table entries.

Tasks are independent and picklable (op name, case, target names, spec files), so a
cluster runner can hand each to a worker that calls `run_task(task, device)` and returns
its rows; `run_tasks` is the local runner (every task captured first, then all kernels
compiled in one parallel batch, the compile budget pooled across the tasks).
"""

from __future__ import annotations

import dataclasses
import itertools
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from speedlight import launch, registry, results, target as targets
from speedlight.inspect import case_report, findings
from speedlight.inspect.compile import TritonCompiler
from speedlight.inspect.launches import Launch, Recorder, intercept
from speedlight.spec import Case, OpSpec
from speedlight.tuning import Configs

# inspect's findings that reject a candidate (kind -> short name shown in the table)
PRUNING = {"compile-error": "does not compile", "spill": "spills",
           "smem-limit": "shared memory over the block limit",
           "occupancy": "occupancy below design", "shallow-pipeline": "stages below design"}

DEFAULT_MAX_COMPILES = 24


@dataclass(frozen=True)
class Task:
    """One shape of one op and the space to sweep on it, for one target."""

    op: str  # the OpSpec's name (its `configs` declares the space)
    case: Case
    target: str  # the arch compiled for (sm_90a)
    sku: str  # the SKU launches are sized for and the table is written for (h100-sxm)
    max_compiles: int = DEFAULT_MAX_COMPILES
    time: bool = False  # time the survivors (the GPU in use is the target's SKU)
    spec_files: tuple[str, ...] = ()  # a team's own ops (registry.select)
    space: tuple = ()  # (name, values) pairs overriding the declared space; () = declared


@dataclass
class _Candidate:
    config: dict
    launches: list[Launch] = field(default_factory=list)
    asked: int = 0  # how many launches asked the op for a configuration
    key: Any = None  # the key the first launch asked with (its bucket names the shape)
    error: str = ""


def configurable(spec: OpSpec, arch: int | str | None = None) -> Configs:
    """The configuration space `spec` declares (OpSpec.configs) for `arch` (the target's:
    an AMD target's may add knobs, Configs.space_for), or ValueError."""
    configs = spec.configs
    if configs is None or not configs.space_for(arch):
        where = f" on {targets.arch_name(arch)}" if arch is not None and configs else ""
        raise ValueError(f"op {spec.name} declares no configuration space to tune{where}: "
                         f"give its OpSpec configs=speedlight.tuning.Configs({spec.name!r}, "
                         f"space, default, bucket), the space its launchers ask "
                         f"launch.config in")
    if configs.op != spec.name:
        raise ValueError(f"op {spec.name}: its OpSpec's configs are op {configs.op!r}'s; the "
                         f"tuned tables are read and written under the op's own name")
    return configs


def tasks(spec: OpSpec, cases: Sequence[Case], tgt: targets.Target, *,
          max_compiles: int = DEFAULT_MAX_COMPILES, time: bool = False,
          spec_files: Sequence[str] = ()) -> list[Task]:
    """One task per distinct shape of `cases` (cases differing only in their seed or in
    injected non-finite values are one shape); `max_compiles` is the whole sweep's
    budget, shared evenly (at least one compile per shape: the rule's). run_tasks pools
    the shares, so what a shape without a launch leaves goes to the shapes after it."""
    configurable(spec, tgt.arch)
    seen, shapes = set(), []
    for case in cases:
        flags = tuple((k, v) for k, v in case.flags if k != "nonfinite")
        key = (case.params, case.dtype, case.layout, flags)
        if key not in seen:
            seen.add(key)
            shapes.append(case)
    share, extra = divmod(max_compiles, max(1, len(shapes)))
    return [Task(spec.name, case, tgt.arch_name, tgt.sku.key, max(1, share + (i < extra)),
                 time, tuple(spec_files)) for i, case in enumerate(shapes)]


def ordered(space: Mapping[str, Sequence[Any]], first: Mapping[str, Any]) -> list[dict]:
    """Every point of `space`, `first` first, then by how far each is from it: fewer
    parameters changed, then smaller steps, then which parameter (in turn)."""
    names = list(space)
    index = {n: {v: i for i, v in enumerate(space[n])} for n in names}

    def rank(point):
        changed = [i for i, n in enumerate(names) if point[n] != first.get(n)]
        steps = sum(abs(index[names[i]][point[names[i]]] - index[names[i]].get(first.get(
            names[i]), 0)) for i in changed)
        return (len(changed), steps, changed)

    points = [dict(zip(names, values)) for values in itertools.product(*space.values())]
    ranked = sorted(((rank(p), p) for p in points), key=lambda rp: rp[0])  # each ranked once
    # within one distance, the parameters changed in turn: BLOCK_M, BLOCK_N, ..., BLOCK_M...
    turns: dict[tuple, int] = {}
    keyed = []
    for r, p in ranked:
        group = (r[0], r[1], tuple(r[2]))
        turns[group] = turns.get(group, -1) + 1
        keyed.append(((r[0], r[1], turns[group], r[2]), p))
    keyed.sort(key=lambda kp: kp[0])
    first = dict(first)
    return [first] + [p for _, p in keyed if p != first]


def config_text(config: Mapping[str, Any]) -> str:
    """A configuration in one short line: BLOCK_M=128 BLOCK_N=256 ... num_stages=3."""
    return " ".join(f"{k}={v}" for k, v in config.items())


# --- running a task ------------------------------------------------------------------------

def _spec(task: Task) -> OpSpec:
    return registry.select([task.op], task.spec_files)[0]


def _capture(spec: OpSpec, configs: Configs, inputs: dict, config: dict | None,
             tgt: targets.Target) -> _Candidate:
    """The op's forward launches on `inputs` with `config` forced (None: the rule), none
    executed (sized for the target: the caller entered launch.for_target)."""
    cand = _Candidate(dict(config) if config is not None else {})
    recorder = Recorder(tgt.arch, "dry")
    try:
        with launch.forcing(configs.op, config) as asked, intercept(recorder), \
                torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            spec.impl(**inputs)
    except Exception as e:  # the launcher refused the configuration: a rejection, said why
        text = str(e).strip()
        cand.error = f"{type(e).__name__}: {text.splitlines()[0][:200] if text else ''}"
        return cand
    cand.launches = recorder.launches
    cand.asked = len(asked)
    if config is None and asked:
        cand.config = dict(asked[0][1]) if asked[0][1] is not None else {}
    cand.key = asked[0][0] if asked else None
    return cand


def _signature(cand: _Candidate, arch_name: str) -> tuple:
    return tuple((l.key(arch_name), l.grid) for l in cand.launches)


def _kernel_fields(reports: list[case_report.KernelReport]) -> dict:
    """What the row keeps of a candidate's kernels (the one that binds: most registers)."""
    ok = [k for k in reports if k.ok]
    if not ok:
        return {}
    k = max(ok, key=lambda k: (k.spill_stores + k.spill_loads, k.registers))
    return {"kernel": k.launch.kernel, "registers": k.registers,
            "spill_bytes": k.spill_stores + k.spill_loads, "smem": k.smem,
            "smem_limit": k.smem_limit, "occupancy": round(k.occupancy.fraction, 4),
            "stages": k.stages, "grid": list(k.launch.grid),
            "num_warps": k.launch.num_warps, "num_stages": k.launch.num_stages}


def _rejections(reports: list[case_report.KernelReport], arch_name: str) -> list[dict]:
    out = []
    for k in reports:
        design = k.design
        for f in findings.kernel_findings(k, arch_name):
            if f.code not in PRUNING or (f.code == "spill" and design.spills):
                continue
            out.append({"kind": f.code, "why": PRUNING[f.code], "message": f.text})
    return out


@dataclass
class _Staged:
    """A task captured and ready to compile: what _finish needs."""

    task: Task
    spec: OpSpec
    configs: Configs
    tgt: targets.Target
    device: torch.device
    inputs: dict
    base: dict
    rows: list  # a row per candidate examined, in order (staged ones filled in by _finish)
    staged: list  # (candidate, row) to compile and judge
    over: int  # candidates left over the cap

    @property
    def launches(self) -> list[Launch]:
        return [l for cand, _ in self.staged for l in cand.launches]


def _prepare(task: Task, device: torch.device) -> _Staged | list[dict]:
    """Capture the rule and the candidates (the compile cap applied, duplicates found);
    the task's finished rows instead when the shape is skipped."""
    spec = _spec(task)
    tgt = targets.resolve(task.target, task.sku, device)
    configs = configurable(spec, tgt.arch)
    with launch.for_target(tgt):  # the launches a user of the target's SKU gets
        return _capture_candidates(task, spec, configs, tgt, device)


def _capture_candidates(task: Task, spec: OpSpec, configs: Configs, tgt: targets.Target,
                        device: torch.device) -> _Staged | list[dict]:
    base = {"tool": "tune", "op": spec.name, "case_id": task.case.id,
            "case": task.case.to_json(), "sku": tgt.sku.key, "target": tgt.arch_name}
    reason = spec.skip(task.case, device)
    if reason:
        return [dict(base, status="skip", reason=reason)]
    space = dict(task.space) if task.space else dict(configs.space_for(tgt.arch))
    inputs = spec.make_inputs(task.case, device)
    rule = _capture(spec, configs, inputs, None, tgt)
    if rule.error:
        return [dict(base, status="error", reason=f"the op failed on this case: {rule.error}")]
    if not rule.launches or not rule.asked:
        why = ("no launch (an empty input, or a path without a kernel)" if not rule.launches
               else "its launcher asks for no configuration on this shape (a fixed rule there)")
        return [dict(base, status="skip", reason=why)]
    base["bucket"] = configs.bucket(rule.key) if configs.bucket else None
    rule_config = rule.config
    st = _Staged(task, spec, configs, tgt, device, inputs, base, [], [], 0)
    seen: dict[tuple, dict] = {}
    for config in ordered(space, rule_config):
        is_rule = config == rule_config
        if len(st.staged) >= task.max_compiles:
            st.over += 1
            continue
        cand = rule if is_rule else _capture(spec, configs, inputs, config, tgt)
        cand.config = config
        row = dict(base, config=config, rule=is_rule)
        if cand.error:
            st.rows.append(dict(row, status="pruned", reasons=[{
                "kind": "launcher", "why": "refused by the launcher", "message": cand.error}]))
            continue
        sig = _signature(cand, tgt.arch_name)
        if sig in seen:
            st.rows.append(dict(row, status="duplicate",
                                reason=f"the same launches as {config_text(seen[sig])}"))
            continue
        seen[sig] = config
        st.staged.append((cand, row))
        st.rows.append(row)
    return st


def _finish(st: _Staged, compiled: dict) -> list[dict]:
    """Judge each compiled candidate, then time and verify (or say why not)."""
    arch_name = st.tgt.arch_name
    rows, survivors = list(st.rows), []
    for cand, row in st.staged:
        reports = [case_report.analyse_kernel(l, compiled[l.key(arch_name)], st.tgt,
                                              st.tgt.sku, st.spec.design(l.kernel, st.tgt.arch))
                   for l in cand.launches]
        row.update(_kernel_fields(reports))
        predicted = [k.predicted for k in reports if k.ok]
        if predicted and all(p is not None for p in predicted):  # every launch, on the SKU
            row.update(predicted_us=round(sum(p.us for p in predicted), 3),
                       predicted_bound=max(predicted, key=lambda p: p.seconds).bound)
        rejected = _rejections(reports, arch_name)
        if rejected:
            row.update(status="pruned", reasons=rejected)
        else:
            row.update(status="survivor")
            survivors.append(row)
    # ranked by the predicted time before any GPU time (those without one after)
    ranked = sorted(survivors, key=lambda r: r.get("predicted_us", float("inf")))
    for n, row in enumerate(ranked, 1):
        if "predicted_us" in row:
            row["predicted_rank"] = n
    if st.over:
        rows.append(dict(st.base, status="not-compiled", count=st.over,
                         reason=f"{st.over} more configurations not examined: this shape's "
                                f"share of --max-compiles ({st.task.max_compiles}) was spent"))
    if st.task.time:
        staged = sorted((r for _, r in st.staged),
                        key=lambda r: r.get("predicted_us", float("inf")))
        _time_and_verify(st.spec, st.configs, st.task.case, st.inputs, staged, st.tgt,
                         st.device)
    else:
        why = ("no GPU in use" if st.device.type != "cuda" else
               f"the GPU in use is not the target ({st.tgt.sku.name})")
        for row in survivors:
            row["timing"] = f"skipped: {why}"
    return rows


def run_task(task: Task, device: torch.device | str = "cpu", *,
             compiler: TritonCompiler | None = None) -> list[dict]:
    """The rows of one task (see the module docstring): one per configuration examined,
    one counting those over the compile cap, or one saying why the shape was skipped."""
    device = torch.device(device)
    st = _prepare(task, device)
    if isinstance(st, list):
        return st
    compiler = compiler or TritonCompiler()
    return _finish(st, compiler.compile(st.launches, st.tgt))


# --- on the GPU ----------------------------------------------------------------------------

def _stop_rule(device: torch.device):
    from speedlight.bench.timer import CPU_RULE, StopRule

    if device.type != "cuda":
        return CPU_RULE
    # a ranking, not a report: fewer samples than bench takes, still converged to 2%
    return StopRule(target_rse=0.02, min_samples=10, max_samples=100, time_cap_s=0.3)


def _time(spec: OpSpec, configs: Configs, inputs: dict, config: dict, device: torch.device,
          flush) -> float:
    """Median microseconds of the op's forward (no gradient) with `config` forced."""
    from speedlight.bench.timer import clock_for, measure

    def run(_k):
        return spec.impl(**inputs)

    with launch.forcing(configs.op, config), torch.no_grad():
        m = measure(run, clock=clock_for(device), rule=_stop_rule(device), flush=flush)
    return m.summary.median * 1e6


def _time_and_verify(spec: OpSpec, configs: Configs, case: Case, inputs: dict,
                     examined: list[dict], tgt: targets.Target, device: torch.device) -> None:
    """Time the survivors and the rule; verify the fastest, the next fastest if it fails.
    On a CPU (tests only: the CLI times on the target GPU alone) the launches run under
    the interpreter sized for the target, and the rows say the times are not
    representative."""
    from speedlight.bench.timer import flush_for
    from speedlight.verify.harness import verify_case

    flush = flush_for(device)
    # on a CPU sized for the target; on the GPU (the target, in use) its own sizing
    with launch.for_target(tgt if device.type != "cuda" else None):
        timed = []
        for row in examined:
            if row["status"] != "survivor" and not row.get("rule"):
                continue
            try:
                row["median_us"] = round(_time(spec, configs, inputs, row["config"], device,
                                               flush), 3)
            except Exception as e:  # a launch that fails on the GPU: rejected with the reason
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                row.update(status="pruned", reasons=row.get("reasons", []) + [{
                    "kind": "launch", "why": "fails to run",
                    "message": f"{type(e).__name__}: {e}"[:300]}])
                continue
            if device.type != "cuda":
                row["timing"] = "interpreter: not representative"
            if row["status"] == "survivor":
                timed.append(row)
        rule_us = next((r.get("median_us") for r in examined if r.get("rule")), None)
        for row in sorted(timed, key=lambda r: r["median_us"]):
            with launch.forcing(configs.op, row["config"]):
                verdict = verify_case(spec, case, device)
            row["verified"] = verdict.status
            if verdict.status == "pass":
                row.update(status="best", rule_us=rule_us)
                if rule_us:
                    row["speedup"] = round(rule_us / row["median_us"], 4)
                return
            row.update(status="pruned", reasons=[{"kind": "verify", "why": "fails verification",
                                                  "message": verdict.reason or verdict.status}])


def run_tasks(tasks_: Sequence[Task], device: torch.device | str = "cpu", *,
              compiler: TritonCompiler | None = None,
              on_task: Callable[[Task, list[dict]], None] | None = None) -> list[dict]:
    """Every task's rows, as run_task gives them, run here: every task captured first,
    then all their kernels compiled in one batch (the compiler's worker processes in
    parallel; a kernel several shapes share compiles once), then each judged and timed."""
    device = torch.device(device)
    compiler = compiler or TritonCompiler()
    # the tasks' shares, pooled: what a skipped shape (no launch) leaves goes to those after it
    budget, prepared = sum(t.max_compiles for t in tasks_), []
    for i, task in enumerate(tasks_):
        share = max(1, budget // (len(tasks_) - i))
        st = _prepare(dataclasses.replace(task, max_compiles=share), device)
        budget -= 0 if isinstance(st, list) else len(st.staged)
        prepared.append(st)
    staged = [st for st in prepared if not isinstance(st, list)]
    by_target: dict[str, list[_Staged]] = {}
    for st in staged:
        by_target.setdefault(st.tgt.arch_name, []).append(st)
    compiled: dict = {}
    for group in by_target.values():
        compiled.update(compiler.compile([l for st in group for l in st.launches],
                                         group[0].tgt))
    rows = []
    for i, task in enumerate(tasks_):
        st, prepared[i] = prepared[i], None  # a finished task's inputs are not kept
        got = st if isinstance(st, list) else _finish(st, compiled)
        rows += got
        if on_task is not None:
            on_task(task, got)
    return rows


def winners(rows: Sequence[dict]) -> dict[str, dict[str, dict[str, dict]]]:
    """{sku: {op: {bucket: entry}}} of the rows' best configurations (the first shape of
    a bucket wins it), each entry with how it was chosen."""
    import triton

    env = results.environment(torch.device("cpu"))
    out: dict[str, dict[str, dict[str, dict]]] = {}
    for row in rows:
        if row.get("status") != "best" or not row.get("bucket"):
            continue
        ops = out.setdefault(row["sku"], {}).setdefault(row["op"], {})
        ops.setdefault(row["bucket"], {
            "config": row["config"], "impl": None, "median_us": row["median_us"],
            "rule_us": row.get("rule_us"), "speedup": row.get("speedup"),
            "verified": row.get("verified") == "pass", "case_id": row["case_id"],
            "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "torch": torch.__version__, "triton": triton.__version__,
            "git": env.get("git")})
    return out
