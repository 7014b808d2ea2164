"""torch.compile of speedlight's custom ops against eager, on this machine's torch: the
scenarios of tests/compile_equal.py (tiny patched models of Llama, Phi-3 and Qwen2-MoE;
every op of the registry in one function; the variants they leave out; every inference op
without gradients), each compiled with fullgraph=True under each backend, its outputs and
gradients compared with the same function run eagerly, and the speedlight ops its
compiled graphs hold checked. It catches a torch release that compiles custom ops wrong
without a word (pytorch/pytorch#180642, torch 2.11).

    python scripts/gpu/compile_equal.py --out DIR [--budget-s N] [--backends aot_eager,inductor]

One JSON line per (scenario, backend) in DIR/compile_equal.jsonl: pass or fail, the ops
held, the largest difference, the seconds it took (compile included: not a timing of the
ops), the versions; a scenario not started within --budget-s is recorded as skipped (the
first always runs). On a GPU the backends are aot_eager and inductor; on a CPU (the Triton
interpreter) aot_eager only, inductor's C++ compiles taking minutes there. Exits 1 when a
scenario fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="folder the JSON lines are written to")
    p.add_argument("--budget-s", type=float, default=120.0,
                   help="no scenario but the first starts after this many seconds (default 120)")
    p.add_argument("--backends", default=None,
                   help="comma-separated (default: aot_eager,inductor on a GPU, aot_eager on a CPU)")
    p.add_argument("--scenarios", default=None,
                   help="comma-separated (default: compile_equal.GPU_SCENARIOS)")
    p.add_argument("--device", default="auto", help="auto, cuda or cpu")
    args = p.parse_args(argv)

    from speedlight.runtime import select_device

    device = select_device(args.device)  # the CPU's interpreter is on before triton loads
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from speedlight.results import append_jsonl, environment, writable_folder
    from tests import compile_equal

    on_gpu = device.startswith("cuda")
    backends = (args.backends.split(",") if args.backends else
                ["aot_eager", "inductor"] if on_gpu else ["aot_eager"])
    scenarios = (args.scenarios.split(",") if args.scenarios else
                 list(compile_equal.GPU_SCENARIOS))
    unknown = [s for s in scenarios if s not in compile_equal.SCENARIOS]
    if unknown:
        p.error(f"unknown scenarios {unknown}; known: {', '.join(compile_equal.SCENARIOS)}")
    out = writable_folder(args.out) / "compile_equal.jsonl"
    env = environment(device)
    start = time.perf_counter()
    failed = ran = 0
    for scenario in scenarios:
        for backend in backends:
            if ran and time.perf_counter() - start > args.budget_s:
                row = {"scenario": scenario, "backend": backend, "status": "skipped",
                       "reason": f"not started within --budget-s {args.budget_s:g}"}
            else:
                ran += 1
                try:
                    row = compile_equal.check(scenario, backend, device).row()
                except Exception as e:  # a compile that fails is a result, the rest still run
                    row = {"scenario": scenario, "backend": backend, "status": "fail",
                           "mismatch": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
            failed += row["status"] == "fail"
            append_jsonl(out, [{**env, "check": "compile_equal", **row}])
            print(f"{scenario:16s} {backend:9s} {row['status']:7s} "
                  f"{row.get('mismatch') or row.get('reason') or ''}"
                  f"{' missing ' + ','.join(row['missing_ops']) if row.get('missing_ops') else ''}")
    print(f"compile_equal: {failed} failed; rows in {out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
