"""The `speedlight` command: one sub-command per tool.

Each tool's sub-command lives beside the tool (`speedlight/<tool>/command.py`, with
`configure(parser)` and `run(args) -> exit status`); this file only dispatches, and picks
the runtime before any kernel is imported: the GPU when there is one, else the CPU through
the Triton interpreter.
"""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "report": ("speedlight.pipeline.command", "the main job: profile, patch, verify, bench, inspect and "
                                      "profile again one model, into one report page"),
    "verify": ("speedlight.verify.command", "prove every op correct against float64"),
    "bench": ("speedlight.bench.command", "time ops against PyTorch, torch.compile and Liger; "
                                          "compare runs; plot"),
    "probe": ("speedlight.bench.probe_command", "measure this GPU's copy bandwidth and matmul rates"),
    "profile": ("speedlight.profile.command",
                "where a model's time and memory go, what bounds each op, what to fuse"),
    "shape": ("speedlight.shape.command", "shape a new op before writing its kernel: floors, "
              "bound, layout advice, torch.compile's answer, a spec file"),
    "inspect": ("speedlight.inspect.command", "read the compiler's output for any GPU: "
                "registers, spills, occupancy, SASS, bytes moved"),
    "plan": ("speedlight.planning.command", "measure which of speedlight.patch's kinds are faster "
             "on this GPU at a model's shapes; patch(plan='auto') applies that plan"),
    "tune": ("speedlight.tune.command", "choose an op's launch configuration per GPU and "
             "shape: prune by the compiled kernels, time on the GPU, write the tuned table"),
}


def _patch(model, plan=None, example_inputs=None):
    """speedlight.patch, handed to the commands that compare a model with speedlight's ops
    swapped in (`profile --project`, `bench model`): no tool imports another, the CLI (a
    composer) wires them. plan=None: every kind ("speedlight (all)"); "measure" with the
    example inputs: the kinds speedlight.plan keeps ("speedlight (planned)"). The planning
    composer is named by string, as the sub-commands are: a composer over a composer would
    pass the longest import chain the floors allow."""
    planning = importlib.import_module("speedlight.planning")
    return planning.patch(model, plan=plan, example_inputs=example_inputs)


def _plan(model, example_inputs, **options):
    """speedlight.plan, handed to the report, as _patch is."""
    return importlib.import_module("speedlight.planning").plan(model, example_inputs, **options)


def _predict(spec, case, target):
    """inspect's predicted time of an op's case on a target (per direction), handed to bench
    (`--predict`) and profile as _patch is: no tool imports another."""
    return importlib.import_module("speedlight.inspect.run").predict_case(spec, case, target)


# What each sub-command's run(args, ...) is handed, by keyword: the functions of other tools
# and composers it calls (no tool imports another; cli.py, a composer, wires them)
HANDED = {"report": ("plan",), "profile": ("patch", "predictor"), "bench": ("patch", "predictor"),
          "plan": ("patch",)}


def add_common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="auto",
                        help="auto (the GPU if there is one, else CPU), cuda, or cpu "
                             "(kernels run on the Triton interpreter)")


def _requested_device(argv: list[str]) -> str:
    """--device as given (before the parser exists), else auto."""
    for i, arg in enumerate(argv):
        if arg == "--device" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--device="):
            return arg.split("=", 1)[1]
    return "auto"


def build_parser() -> argparse.ArgumentParser:
    from speedlight import __version__

    parser = argparse.ArgumentParser(
        prog="speedlight",
        description="Profile, verify, benchmark and inspect GPU kernels for PyTorch models.")
    parser.add_argument("--version", action="version", version=f"speedlight {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        p = sub.add_parser(name, help=help_text, description=help_text)
        add_common(p)
        importlib.import_module(module).configure(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    # The runtime is chosen before the sub-commands are imported to build the parser: a
    # module they import may import triton, whose language functions (tl.cdiv...) are
    # compiled or interpreted as TRITON_INTERPRET says when triton is first imported.
    from speedlight.runtime import select_device

    try:
        select_device(_requested_device(sys.argv[1:] if argv is None else argv))
    except SystemExit:
        pass  # said again below, once the command line is parsed
    parser = build_parser()
    args = parser.parse_args(argv)
    if not args.command:
        parser.print_help()
        return 2
    args.requested_device = args.device  # as given: a --ray sweep picks its workers' own
    args.device = select_device(args.device)
    functions = {"patch": _patch, "plan": _plan, "predictor": _predict}
    handed = {name: functions[name] for name in HANDED.get(args.command, ())}
    return int(importlib.import_module(COMMANDS[args.command][0]).run(args, **handed) or 0)


if __name__ == "__main__":
    sys.exit(main())
