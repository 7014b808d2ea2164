"""Run a function on several gloo ranks in fresh processes, for the distributed tests.

Each rank is a new interpreter (torch.multiprocessing's spawn), so TRITON_INTERPRET is in
its environment before triton is first imported there; the ranks meet over a file store in
a fresh temporary folder (no port to race for when two test modules spawn ranks at once).
The function runs on every rank and returns a JSON-able value; rank 0's comes back.
Spawning and importing cost seconds, so a test module runs all its checks in one call.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import time
import traceback

import torch


def run_ranks(target: str, world: int = 2, timeout_s: float = 300.0):
    """target "module:function", called as function(rank, world) on `world` ranks of one
    gloo process group; returns what rank 0 returned."""
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rank0.json")
        # the ranks compute on CPU tensors, through the interpreter, on a GPU machine too;
        # they inherit the environment at their start, after which this process's returns
        before = os.environ.get("TRITON_INTERPRET")
        os.environ["TRITON_INTERPRET"] = "1"
        try:
            ranks = torch.multiprocessing.start_processes(
                _rank_main, args=(world, os.path.join(tmp, "store"), target, out, timeout_s),
                nprocs=world,
                join=False, start_method="spawn")
        finally:
            if before is None:
                del os.environ["TRITON_INTERPRET"]
            else:
                os.environ["TRITON_INTERPRET"] = before
        while not ranks.join():
            pass
        with open(out) as f:
            return json.load(f)


def _rank_main(rank: int, world: int, store: str, target: str, out: str, timeout_s: float):
    import datetime

    import torch.distributed as dist
    torch.set_num_threads(1)  # two ranks share a small CPU
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
    try:
        module, name = target.split(":")
        result = getattr(importlib.import_module(module), name)(rank, world)
        if rank == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()
    # Done, and rank 0's result is on disk: leave without the interpreter's finalization.
    # Under torch 2.11 a CPU rank aborted there about once in five runs, after every rank
    # had destroyed its group ("terminate called without an active exception", no Python
    # frame: a C++ thread destroyed while joinable), and spawn reported the run as failed.
    # A rank that raised does not get here, so its traceback still reaches the test.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def check(results: dict, name: str, fn) -> None:
    """results[name] = fn()'s dict, or {"error": the traceback} when it raises: one failing
    check must not hide the others run in the same processes."""
    start = time.perf_counter()
    try:
        results[name] = fn()
        results[name]["seconds"] = round(time.perf_counter() - start, 2)
    except Exception:  # noqa: BLE001 -- reported to the test, which fails on it
        results[name] = {"error": traceback.format_exc()}
