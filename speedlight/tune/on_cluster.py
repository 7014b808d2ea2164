"""`speedlight tune --ray`: the tune tasks (one shape each) spread over a Ray cluster
(speedlight.cluster), one whole GPU per task.

A worker runs `sweep.run_task`, the function the local runner is built on, with its own
compiler. Without --target, each GPU worker tunes for the GPU it was given (`--target
native` there): it prunes for that GPU's arch, times the survivors on it, and its rows
name its SKU, so `sweep.winners` writes one table per GPU model of the cluster. With
--target, or on CPU workers, the workers prune for that target and time nothing (as a
local run on a GPU that is not the target). Each task's rows carry the worker's host and
device. A task whose worker died on both tries is an error row with the reason.
"""

from __future__ import annotations

import dataclasses

from speedlight import cluster

WORKER = "speedlight.tune.on_cluster:worker"


def worker(payload: dict, device: str):
    """On a Ray worker (runtime already chosen): a compiler, then a function that runs one
    task into its rows, each with this worker's environment."""
    import torch

    from speedlight import results
    from speedlight.inspect.compile import TritonCompiler
    from speedlight.tune import sweep

    dev = torch.device(device)
    compiler = TritonCompiler(jobs=payload["jobs"])
    env = results.environment(dev)
    return lambda task: [dict(env, **row) for row in sweep.run_task(task, dev, compiler=compiler)]


def tune_on_ray(tasks, ray: cluster.RaySweep, *, jobs: int | None = None,
                target: str | None = None, on_task=None, say=print,
                on_total=None) -> tuple[list[dict], bool]:
    """sweep.run_tasks over the Ray cluster `ray` names, `jobs` compiles at once per
    worker: (the rows, in the order the tasks finished; whether they were timed). Without
    a `target` (--target as given) on GPU workers, each tunes for the GPU it was given."""
    device, models = ray.join(say)
    timed = device == "cuda" and target is None
    if timed:  # each worker tunes for, and times on, the GPU it was given
        tasks = [dataclasses.replace(t, target="native", sku=None, time=True) for t in tasks]
        say("Ray: each worker tunes for the GPU it was given and times the survivors there")
    elif tasks:
        say(f"Ray: the workers prune for {tasks[0].target} (launches sized for "
            f"{tasks[0].sku}); nothing is timed" + ("" if device == "cpu" else
                                                   " (--target names the GPU, not the workers)"))
    groups = cluster.on_each([cluster.Group(f"{t.op} {t.case.id}", {"jobs": jobs}, [t])
                              for t in tasks], models)
    if on_total is not None:
        on_total(len(groups))
    rows: list[dict] = []

    def on_item(group, task, task_rows):
        rows.extend(task_rows)
        if on_task is not None:
            on_task(task, task_rows)

    def on_lost(group, task, reason):
        on_item(group, task, [{"tool": "tune", "op": task.op, "case_id": task.case.id,
                               "case": task.case.to_json(), "sku": task.sku,
                               "target": task.target, "status": "error", "reason": reason}])

    cluster.run_on_ray(WORKER, groups, device=device, cpus=ray.cpus, on_item=on_item,
                       on_lost=on_lost)
    return rows, timed
