"""`speedlight bench --ray`: the same cases, timed on a Ray cluster (speedlight.cluster).

One task per case (op, dtype and shape: one kernel specialisation), holding one whole GPU
while it times speedlight and every baseline on it, so no two timings share a GPU. A worker
builds its own `runner.Bench` for the GPU it was given (the target, roof and timing rule of
that GPU unless --target says otherwise) and runs `Bench.case_rows`, as a local run does:
its rows carry that worker's host and GPU model, and `speedlight bench table` groups them by
GPU. The driver appends each case's rows as they arrive; a case whose worker died on both
tries gets error rows with the reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

from speedlight import cluster

WORKER = "speedlight.bench.on_cluster:worker"


def worker(payload: dict, device: str):
    """On a Ray worker (runtime already chosen): a Bench for this worker's device, then a
    function that times one case into its rows."""
    import dataclasses

    import torch

    from speedlight import registry, results, target
    from speedlight.bench.baselines import compile_limits
    from speedlight.bench.runner import Bench
    from speedlight.bench.timer import default_rule

    dev = torch.device(device)
    spec = registry.select([payload["op"]], payload["spec_files"],
                           include_builtin=payload["include_builtin"])[0]
    settings = dataclasses.replace(
        payload["settings"], rule=dataclasses.replace(default_rule(dev), **payload["rule"]))
    tgt = target.resolve(payload["target"], payload["sku"], dev,
                         results.environment(dev).get("driver"))
    bench = Bench(dev, settings, payload["baselines"], suite=payload["suite"],
                  run_id=payload["run"], target=tgt)

    def one(case):
        with compile_limits():
            return bench.case_rows(spec, case)
    return one


def bench_on_ray(specs, cases_of, out_path: Path, ray: cluster.RaySweep, *, settings,
                 rule_overrides: dict, baselines, suite: str, spec_files: Sequence[str] = (),
                 include_builtin: bool = True, target: str | None = None,
                 sku: str | None = None, run_id: str | None = None, on_case=None, say=print,
                 on_total=None) -> list[dict]:
    """bench's command.bench_cases over the Ray cluster `ray` names: the rows, in the
    order the cases finished; each case's rows appended to out_path as they arrive. The
    workers load the ops as `spec_files` and `include_builtin` say and resolve `target` and
    `sku` (the flags as given) on their own GPU."""
    import dataclasses

    import torch

    from speedlight import results
    from speedlight.bench.baselines import SPEEDLIGHT
    from speedlight.bench.runner import Bench

    device, models = ray.join(say)
    payload = {"spec_files": [str(Path(f).resolve()) for f in spec_files],
               "include_builtin": include_builtin, "target": target, "sku": sku,
               "settings": dataclasses.replace(settings, rule=None), "rule": rule_overrides,
               "baselines": baselines, "suite": suite, "run": run_id or uuid.uuid4().hex[:12]}
    groups = cluster.on_each([cluster.Group(f"{spec.name} {case.id}", dict(payload, op=spec.name),
                                            [case]) for spec in specs for case in cases_of(spec)],
                             models)
    by_name = {s.name: s for s in specs}
    # the rows of a case no worker could run: a driver-side Bench only names them
    namer = Bench(torch.device("cpu"), dataclasses.replace(settings, rule=None), baselines,
                  suite=suite, run_id=payload["run"])
    rows: list[dict] = []

    def on_item(group, case, case_rows):
        results.append_jsonl(out_path, case_rows)
        rows.extend(case_rows)
        if on_case is not None:
            on_case(by_name[group.payload["op"]], case, case_rows)

    def on_lost(group, case, reason):
        spec = by_name[group.payload["op"]]
        lost = namer.skip_rows(spec, case, reason)
        for row in lost:
            row.update(status="error", device="unknown (no worker finished it)", runtime=device,
                       host=None, representative=False)
            if row["implementation"] == SPEEDLIGHT:
                row.update(verified=None, verify_status="not run", verify_note=reason)
        on_item(group, case, lost)

    if on_total is not None:  # each case once per GPU model named
        on_total(sum(len(g.items) for g in groups))
    cluster.run_on_ray(WORKER, groups, device=device, cpus=ray.cpus, on_item=on_item,
                       on_lost=on_lost)
    return rows
