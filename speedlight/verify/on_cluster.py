"""`speedlight verify --ray`: the same cases, spread over a Ray cluster (speedlight.cluster).

One task per op, implementation and kernel specialisation (the case without its seed:
shape, layout, flags and dtype), so a worker compiles each kernel once and runs every seed
of it. A worker runs the harness's `verify_case`, as a local run does, on its own device:
its rows carry that worker's host, GPU model and versions. The driver appends each row to
the results file as it arrives; a case whose worker died on both tries gets an error row
with the reason.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Sequence

from speedlight import cluster

WORKER = "speedlight.verify.on_cluster:worker"


def worker(payload: dict, device: str):
    """On a Ray worker (runtime already chosen): set up once, then a function that verifies
    one case into (its row, its CaseResult), as command.verify_cases does locally."""
    import torch

    from speedlight import registry, results, target
    from speedlight.verify import harness

    dev = torch.device(device)
    spec = registry.select([payload["op"]], payload["spec_files"],
                           include_builtin=payload["include_builtin"])[0]
    max_bytes = harness.default_max_bytes(dev, payload["max_gib"])
    env = results.environment(dev)
    env["target"] = target.resolve(payload["target"], payload["sku"], dev,
                                   env.get("driver")).sku.key
    which = {"impl": payload["impl"]} if payload["impl"] is not None else {}

    def one(case):
        r = harness.verify_case(spec, case, dev, max_bytes=max_bytes, **which)
        return dict(r.to_row(), suite=payload["suite"], run=payload["run"], **env), r
    return one


def _implementations(spec, named=()) -> list:
    """The spec's implementations to verify one by one (those a sweep runs, OpSpec.swept,
    where specs declare several), else [None]: the spec's one implementation."""
    swept = spec.swept(named) if hasattr(spec, "swept") else None
    return list(swept or [None])


def case_groups(specs, cases_of, payload: dict) -> list[cluster.Group]:
    """One group per (op, implementation, kernel specialisation): the cases of one
    implementation that differ only by seed."""
    out: dict[tuple, cluster.Group] = {}
    for spec in specs:
        impls = _implementations(spec, payload.get("named", ()))
        for case in cases_of(spec):
            for impl in impls:
                key = (spec.name, impl or "", case.with_(seed=0).id)
                if key not in out:
                    out[key] = cluster.Group(" ".join(k for k in key if k),
                                             dict(payload, op=spec.name, impl=impl))
                out[key].items.append(case)
    return list(out.values())


def verify_on_ray(specs, cases_of, out_path: Path, ray: cluster.RaySweep, *, suite: str,
                  spec_files: Sequence[str] = (), include_builtin: bool = True,
                  max_gib: float | None = None, target: str | None = None,
                  sku: str | None = None, named: Sequence[str] = (),
                  run_id: str | None = None, on_case=None, say=print, on_total=None) -> list:
    """verify's command.verify_cases over the Ray cluster `ray` names: the CaseResults,
    in the order they finished; each row appended to out_path as it arrives. The workers
    load the ops as `spec_files` and `include_builtin` say, resolve `target` and `sku` (the
    flags as given) on their own GPU, and run the implementations `named` too."""
    import torch

    from speedlight import results
    from speedlight.verify.harness import CaseResult

    device, models = ray.join(say)
    payload = {"spec_files": [str(Path(f).resolve()) for f in spec_files],
               "include_builtin": include_builtin, "max_gib": max_gib,
               "target": target, "sku": sku, "suite": suite, "named": list(named),
               "run": run_id or uuid.uuid4().hex[:12]}
    by_name = {s.name: s for s in specs}
    lost_env = dict(results.environment(torch.device("cpu")), runtime=device, host=None,
                    device="unknown (no worker finished it)")
    done = []

    def on_item(group, case, value):
        row, r = value
        results.append_jsonl(out_path, [row])
        done.append(r)
        if on_case is not None:
            on_case(by_name[r.op], r)

    def on_lost(group, case, reason):
        spec, impl = by_name[group.payload["op"]], group.payload["impl"]
        named = {}
        if impl is not None:  # the row names the implementation, as a worker's would
            implementation = spec.implementations[impl]
            named = dict(impl=impl, label=spec.label(impl), language=implementation.language,
                         unverified=not implementation.verified)
        r = CaseResult(spec.name, case, "error", reason, **named)
        results.append_jsonl(out_path, [dict(r.to_row(), suite=suite, run=payload["run"],
                                             **lost_env)])
        done.append(r)
        if on_case is not None:
            on_case(by_name[r.op], r)

    sweep = cluster.on_each(case_groups(specs, cases_of, payload), models)
    if on_total is not None:  # each case once per GPU model named
        on_total(sum(len(g.items) for g in sweep))
    cluster.run_on_ray(WORKER, sweep, device=device, cpus=ray.cpus, on_item=on_item,
                       on_lost=on_lost)
    return done
