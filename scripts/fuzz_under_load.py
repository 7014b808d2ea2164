"""Run the project's fuzz suite several times, quiet and under CPU load, and name every
test whose outcome differs between runs (issue 29: an outside bad-input battery once gave
two results under load that a quiet run did not).

Each run is one pytest process (`-p no:cacheprovider`, a JUnit XML of its own); a loaded
run first starts --load busy processes (pure Python loops, one per core by default) and
stops them when pytest ends. A test's outcome is passed, failed, error or skipped; a test
varies when two runs gave it different outcomes or one run did not collect it. The
summary (every run's busy processes, exit status, wall time, load average and outcome
counts, then each varying test with its outcome per run) is written with speedlight.results.write_json; the exit status is 1 when
anything varied.

    python scripts/fuzz_under_load.py --runs 4 --out fuzz-under-load.json
    python scripts/fuzz_under_load.py --tests tests/test_cli_fuzz.py --runs 2 --load 4
"""

from __future__ import annotations

import argparse
from collections import Counter
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speedlight.results import environment, write_json  # noqa: E402

# the bad-input and fault tests: every op argument mutated, every wrongly typed option,
# every refused command line, attention's NaN/inf positions, attention over every cache
# geometry, the unreachable --ray address
FUZZ_TESTS = ["tests/ops/test_fuzz.py", "tests/test_cli_fuzz.py",
              "tests/ops/test_attention_faults.py", "tests/patching/test_cache_fuzz.py",
              "tests/test_cluster_connect.py"]


def _burn(stop) -> None:
    """One core busy until stop is set."""
    x = 0
    while not stop.is_set():
        for _ in range(100_000):
            x = (x * 1_103_515_245 + 12_345) & 0xFFFFFFFF


# a JUnit testcase's child element -> the outcome it means, the first found winning
_TAGS = (("error", "error"), ("failure", "failed"), ("skipped", "skipped"))


def outcomes(junit: Path) -> dict[str, str]:
    """test id (classname::name) -> passed, failed, error or skipped, from a JUnit XML."""
    out = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        tags = {child.tag for child in case}
        out[f"{case.get('classname')}::{case.get('name')}"] = next(
            (outcome for tag, outcome in _TAGS if tag in tags), "passed")
    return out


def run_once(tests: list[str], load: int, workers: str, folder: Path, index: int) -> dict:
    junit = folder / f"run{index}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *(["-n", workers] if workers != "0" else []), *tests]
    stop = multiprocessing.Event()
    burners = [multiprocessing.Process(target=_burn, args=(stop,), daemon=True)
               for _ in range(load)]
    for b in burners:
        b.start()
    start = time.perf_counter()
    try:
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        load_1min = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    finally:
        stop.set()
        for b in burners:
            b.join()
    wall = time.perf_counter() - start
    seen = outcomes(junit) if junit.exists() else {}
    return {"run": index, "load": load, "exit": done.returncode, "wall_s": round(wall, 1),
            "load_1min": load_1min,
            "counts": dict(Counter(seen.values())), "outcomes": seen, "tail": done.stdout[-1500:]}


def varying(runs: list[dict]) -> dict[str, list[str]]:
    """test id -> its outcome in each run ("absent" where a run did not collect it), for
    the tests whose outcomes are not all the same."""
    ids = sorted({t for r in runs for t in r["outcomes"]})
    table = {t: [r["outcomes"].get(t, "absent") for r in runs] for t in ids}
    return {t: o for t, o in table.items() if len(set(o)) > 1}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tests", default=",".join(FUZZ_TESTS),
                   help="comma-separated pytest paths or node ids (default: the fuzz suite)")
    p.add_argument("--runs", type=int, default=4,
                   help="runs in all, alternating quiet and loaded, quiet first (default 4)")
    p.add_argument("--load", type=int, default=os.cpu_count() or 1,
                   help="busy processes during a loaded run (default: one per core)")
    p.add_argument("--workers", default="auto",
                   help="pytest-xdist workers per run, 0 for none (default auto)")
    p.add_argument("--out", default=None, help="write the summary JSON here")
    args = p.parse_args(argv)
    if args.runs < 2:
        p.error(f"--runs must be at least 2 to compare outcomes, got {args.runs}")
    if args.load < 1:
        p.error(f"--load must be at least 1 busy process, got {args.load}")
    tests = [t for t in args.tests.split(",") if t]
    if not tests:
        p.error("--tests names no test")
    where = environment("cpu")  # the checkout as it was when the runs began
    runs = []
    with tempfile.TemporaryDirectory() as folder:
        for i in range(args.runs):
            load = args.load if i % 2 else 0
            r = run_once(tests, load, args.workers, Path(folder), i)
            print(f"run {i} ({'load ' + str(load) if load else 'quiet'}): exit {r['exit']}, "
                  f"{r['wall_s']} s, {r['counts']}", flush=True)
            runs.append(r)
    varied = varying(runs)
    for test, seen in varied.items():
        print(f"VARIES {test}: {' / '.join(seen)}")
    if not varied:
        print(f"no test varied over {len(runs)} runs "
              f"({sum(len(r['outcomes']) for r in runs)} outcomes)")
    if args.out:
        write_json(args.out, {
            "tests": tests, "environment": where, "cpus": os.cpu_count(),
            "workers": args.workers,
            "runs": [{k: v for k, v in r.items() if k != "outcomes"} for r in runs],
            "varying": varied,
            "failed_every_run": sorted(t for t in runs[0]["outcomes"]
                                       if all(r["outcomes"].get(t) in ("failed", "error")
                                              for r in runs)),
        })
    return 1 if varied else 0


if __name__ == "__main__":
    sys.exit(main())
