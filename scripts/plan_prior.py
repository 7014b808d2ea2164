"""Write speedlight/tuned/plan-prior.json, the plan prior patch(plan="auto") reads on a GPU
with no cached plan, from the measured rows under benchmarks/results/
(speedlight.planning.prior says how); --check exits 1 when the shipped file is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from speedlight import plan_prior, results  # noqa: E402
from speedlight.planning import prior  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--results", default=str(ROOT / "benchmarks" / "results"),
                   help="the measured results' root (default: benchmarks/results)")
    p.add_argument("--out", default=str(plan_prior.PRIOR_PATH),
                   help="where to write it (default: the package's speedlight/tuned/)")
    p.add_argument("--check", action="store_true",
                   help="write nothing; exit 1 when --out differs from what would be written")
    args = p.parse_args(argv)
    text = prior.text(prior.build_prior(args.results))
    out = Path(args.out)
    if args.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out} is stale: python scripts/plan_prior.py rewrites it", file=sys.stderr)
            return 1
        print(f"{out} is what benchmarks/results give")
        return 0
    results.write_atomic(out, text)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
