"""`speedlight inspect`: what the compiler made of an op's kernels, for any GPU, with or
without one.

    speedlight inspect rms_norm                     # a representative case; the GPU in use, else H200
    speedlight inspect rms_norm --case rows4096-hidden4095 --dump kernels/
    speedlight inspect softmax --target sm_100a     # B200, sm_100a's flagship
    speedlight inspect --all --target sm_90a --sku h100-sxm   # every op on its quick suite
    speedlight inspect rms_norm --impl cuda --target sm_90a --check   # the CUDA C++ kernels
    speedlight inspect --spec my_op.py --only-spec     # a team's op, Triton or CUDA C++
"""

from __future__ import annotations

import argparse
import re
import uuid
from pathlib import Path

from speedlight import arguments


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", nargs="?", default=None,
                   help="the op to inspect (or several, comma-separated); omit with --all")
    p.add_argument("--all", action="store_true", help="every op, on its --suite")
    p.add_argument("--case", default=None, metavar="ID",
                   help="a case id or label from the op's suites (rms_norm-rows4096-hidden4096-"
                        "bf16, rows4096-hidden4096), or any shape in that form "
                        "(rows4096-hidden4095-strided); default: a 4096-token model case")
    p.add_argument("--suite", default="quick", choices=("quick", "model", "full"),
                   help="the suite --all covers (default quick)")
    arguments.add_dtypes(p, "bf16", plural=False, help_default="bf16; the case's dtype when "
                                                               "--case names none")
    arguments.add_target(p)
    p.add_argument("--dump", default=None, metavar="DIR",
                   help="write TTIR, TTGIR, LLIR, PTX, cubin and SASS of every kernel here")
    p.add_argument("--mode", default="auto", choices=("auto", "run", "sample", "dry"),
                   help="how launches run while captured: run (every program; bytes counted "
                        "under the interpreter), sample (a few programs: layout only), dry "
                        "(none: recorded on meta tensors at any size, bytes from a smaller "
                        "case); auto runs cases the interpreter can afford, samples those "
                        "whose inputs it can make, and records the rest dry")
    p.add_argument("--impl", default="auto", choices=("auto", "triton", "gluon", "cuda", "all"),
                   help="which implementation's kernels: triton (captured from a run), gluon "
                        "(an op's Gluon implementation: launches recorded dry, compiled for the "
                        "target with no GPU), cuda (an OpSpec's CUDA C++ kernels, compiled with "
                        "nvcc: no GPU needed), all; "
                        "auto (default): the op's default implementation (Triton for the "
                        "built-in ops; CUDA C++ for a spec whose impl runs CUDA kernels)")
    p.add_argument("--no-backward", action="store_true",
                   help="forward launches only (the forward of training: inputs that take "
                        "gradients require them)")
    p.add_argument("--check", action="store_true",
                   help="exit 1 if a kernel falls short of its design (vector width, spills, "
                        "occupancy, bytes) on a shape the design covers (contiguous rows "
                        "aligned to 16 bytes); shortfalls elsewhere are printed as information. "
                        "See spec.KernelDesign")
    p.add_argument("--compare", nargs="+", default=None, metavar="ROWS",
                   help="before/after: an earlier run's inspect.jsonl (or its folder) against "
                        "this run's rows, or two files against each other with no op named; "
                        "per kernel the resources and the steady-state loop's figures")
    p.add_argument("--json", action="store_true",
                   help="print the rows (every figure: loops, pipes, source lines, bytes in "
                        "flight, predictions) as JSON lines on stdout instead of the tables")
    arguments.add_spec(p)
    p.add_argument("--jobs", type=int, default=None, help="compile worker processes")
    arguments.add_out(p, "speedlight-results", "folder for inspect.jsonl")


def find_case(spec, text: str, dtype):
    """A case of the op by id or label (searched in every suite), or one parsed from it."""
    from speedlight.spec import DTYPES, LAYOUTS, Case, parse_dtype

    for suite in [x for x in ("quick", "model", "full") if x in spec.suites]:
        for base in spec.cases(suite):
            for d in ([dtype] + [x for x in DTYPES.values() if x != dtype]):
                c = base.with_(dtype=d)
                if text in (c.id, f"{c.label}-{_dt(c)}") or (text == c.label and d == dtype):
                    return c
    tokens = text.split("-")
    if tokens and tokens[0] == spec.name:
        tokens = tokens[1:]
    known = [c for x in ("quick", "model", "full") if x in spec.suites for c in spec.cases(x)]
    names = [k for k, _ in known[0].params] if known else []
    params, flags, layout = {}, {}, "contiguous"
    for tok in tokens:
        m = re.fullmatch(r"([a-z_]+?)(\d+)", tok)
        if tok in LAYOUTS:
            layout = tok
        elif tok.lower() in DTYPES or tok.lower() in ("float32", "float16", "bfloat16"):
            dtype = parse_dtype(tok)
        elif m and m.group(1) in names:
            params[m.group(1)] = int(m.group(2))
        elif m:
            flags[m.group(1)] = int(m.group(2))
        elif tok.startswith("no") and len(tok) > 2:
            flags[tok[2:]] = False
        elif tok:
            flags[tok] = True
    missing = [n for n in names if n not in params]
    if missing or not names:
        raise ValueError(f"case {text!r} is not in {spec.name}'s suites and names no "
                         f"{', '.join(missing) or 'shape'}; write it like "
                         f"{known[0].label if known else 'rows4096-hidden4096'}")
    return Case(spec.name, tuple((n, params[n]) for n in names), dtype=dtype, layout=layout,
                flags=flags)


def _dt(case) -> str:
    from speedlight.spec import dtype_name
    return dtype_name(case.dtype)


REPRESENTATIVE_TOKENS = 4096


def representative(spec, dtype):
    """The op's model-suite case of the first model in shapes.MODELS it covers (Llama 3 8B
    for most ops) at REPRESENTATIVE_TOKENS tokens (OpSpec.rows), whatever its size: a
    launch is captured without running it where running is unaffordable, so any size
    compiles on a CPU. An op whose model suite has no such case: its model case nearest
    that many tokens, else its first quick case."""
    from speedlight import shapes

    order = {name: i for i, name in enumerate(shapes.MODELS)}
    model = [c for c in (spec.cases("model") if "model" in spec.suites else []) if c.params]
    if model:
        best = min(model, key=lambda c: (abs(spec.rows(c) - REPRESENTATIVE_TOKENS),
                                         order.get(c.model, len(order))))
        return best.with_(dtype=dtype)
    quick = spec.cases("quick") if "quick" in spec.suites else []
    if not quick:
        raise ValueError(f"op {spec.name} has no cases")
    return quick[0].with_(dtype=dtype)


def rows(report, base: dict, implementation: str) -> list[dict]:
    """inspect.jsonl rows of a report, whichever compiler built its kernels (`base`: what
    every row of the run carries; `implementation`: what verify and bench rows call the
    implementation, OpSpec.label)."""
    base = dict(base, op=report.op, implementation=implementation, impl=report.impl,
                language=report.language, case_id=report.case.id, case=report.case.to_json(),
                target=report.target.arch_name, sku=report.device.key,
                sm_count=report.sm_count, **({"source": report.source} if report.source else {}))
    if report.skipped or report.error or not report.kernels:
        status = "skip" if report.skipped else "error" if report.error else "no-launch"
        return [dict(base, level="case", status=status,
                     reason=report.skipped or report.error or report.note or
                     f"no {report.language} launch for this case")]
    out = [dict(base, level="kernel", note=report.note, **k.to_json()) for k in report.kernels]
    out += [dict(base, level="bytes", **d.to_json(),
                 findings=[f.to_json() for f in report.findings
                           if f.kernel == "+".join(d.kernels)]) for d in report.directions]
    return out


def _dump(report, folder: Path) -> int:
    """Every stage of each Triton kernel (TTIR to SASS), or the cubin, SASS and ptxas log
    of a CUDA C++ source, under folder/op/case."""
    import shutil

    if report.error or not report.kernels:
        return 0
    if report.impl == "cuda":
        dest = folder / report.op / f"{report.case.id}-cuda"
        dest.mkdir(parents=True, exist_ok=True)
        for name in ("kernel.cubin", "kernel.sass", "ptxas.log"):
            shutil.copyfile(report.binary_folder / name, dest / name)
        return len(report.kernels)
    n = 0
    for k in report.kernels:
        if k.error:
            continue
        stem = f"{k.launch.direction}{k.launch.index}-{k.compiled.name}"
        k.compiled.dump(folder / report.op / report.case.id, stem)
        n += 1
    return n


def _label(spec, impl: str) -> str:
    """The implementation's name in rows, as verify and bench give it (OpSpec.label)."""
    return spec.label(impl) if impl in spec.implementations else f"speedlight-{impl}"


def _wants_triton(spec, impl: str) -> bool:
    """Whether --impl asks for the op's Triton launches (a team's CUDA op has none)."""
    return (spec.cuda is None or not spec.cuda.of_impl) and impl in ("triton", "all", "auto")


def _wants_gluon(spec, impl: str) -> bool:
    """Whether --impl asks for the op's Gluon implementation (named, or all)."""
    return impl in ("gluon", "all") and "gluon" in spec.implementations


def _as_gluon(spec):
    """The spec with its Gluon implementation as impl (what inspect captures)."""
    import dataclasses

    return dataclasses.replace(spec, impl=spec.implementations["gluon"].fn)


def _wants_cuda(spec, impl: str) -> bool:
    """Whether --impl asks for the op's CUDA C++ kernels: auto only where the op's impl is
    them (a team's CUDA op); speedlight's own CUDA kernels with --impl cuda or all."""
    if spec.cuda is None:
        return False
    return impl in ("cuda", "all") or impl == "auto" and spec.cuda.of_impl


def _compare_files(before: str, after, console, as_json: bool) -> int:
    """--compare: print the changes between two sets of inspect rows (after: a path or the
    rows themselves)."""
    import json

    from speedlight.inspect import compare

    try:
        old = compare.read_rows(before)
        new = compare.read_rows(after) if isinstance(after, (str, Path)) else after
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"speedlight inspect: --compare: {e}")
    changes = compare.changes(old, new)
    if as_json:
        for ch in changes:
            print(json.dumps(ch.to_json()))
    else:
        compare.print_changes(changes, console, title=f"before ({before}) and after"
                              + (f" ({after})" if isinstance(after, (str, Path)) else ""))
    return 0


def run(args: argparse.Namespace) -> int:
    import torch

    from speedlight import registry, results
    from speedlight.inspect import display, guard
    from speedlight.inspect.compile import TritonCompiler
    from speedlight.inspect.run import inspect_cases, inspect_cuda_cases
    from speedlight.spec import parse_dtype

    console = results.make_console()
    if args.json:  # stdout holds the rows alone; what inspect says goes to stderr
        from rich.console import Console

        console = Console(stderr=True, width=160)
    if args.compare and len(args.compare) > 2:
        raise SystemExit("speedlight inspect: --compare takes one file of earlier rows (this "
                         "run's are the after), or two (before, after)")
    if args.compare and len(args.compare) == 2:
        if args.all or args.op or args.spec:
            raise SystemExit("speedlight inspect: --compare BEFORE AFTER compares two files; "
                             "name an op with one file (this run is the after)")
        return _compare_files(args.compare[0], args.compare[1], console, args.json)
    if not args.all and not args.op and not args.spec:
        raise SystemExit("speedlight inspect: name an op (speedlight inspect rms_norm) or --all")
    if args.jobs is not None and args.jobs < 1:
        raise SystemExit(f"speedlight inspect: --jobs must be at least 1, got {args.jobs}")
    if args.all and args.case:
        raise SystemExit("speedlight inspect: --case names one case of one op; drop --all")
    device = torch.device(args.device)
    target = arguments.resolve_target(args, "inspect")
    sku = target.sku
    try:
        dtype = parse_dtype(args.dtype)
        names = None if args.all or not args.op else [n.strip() for n in args.op.split(",")]
        specs = registry.select(names, args.spec, include_builtin=not args.only_spec)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight inspect: {str(e).strip(chr(39))}")
    console.print(f"[dim]{target.describe()}[/]")

    if args.impl == "gluon":
        missing = [s.name for s in specs if "gluon" not in s.implementations]
        if missing and (names or len(missing) == len(specs)):
            raise SystemExit(f"speedlight inspect: --impl gluon: {', '.join(missing)} "
                             f"ha(s) no Gluon implementation")
        from speedlight.kernels.attention.gluon_api import missing as gluon_missing
        if gluon_missing():
            raise SystemExit(f"speedlight inspect: --impl gluon: {gluon_missing()}")
        specs = [s for s in specs if "gluon" in s.implementations]
    if args.impl == "cuda":
        missing = [s.name for s in specs if s.cuda is None]
        if missing and (names or len(missing) == len(specs)):
            raise SystemExit(f"speedlight inspect: --impl cuda: {', '.join(missing)} "
                             f"declare(s) no CUDA C++ kernels (OpSpec.cuda)")
        specs = [s for s in specs if s.cuda is not None]

    work = []
    for spec in specs:
        try:
            if args.case:
                work.append((spec, find_case(spec, args.case, dtype)))
            elif args.all:
                if args.suite not in spec.suites:
                    console.print(f"[yellow]{spec.name} has no {args.suite} suite: left out[/]")
                    continue
                work += [(spec, c.with_(dtype=dtype)) for c in spec.cases(args.suite)]
            else:
                work.append((spec, representative(spec, dtype)))
        except ValueError as e:
            raise SystemExit(f"speedlight inspect: {e}")

    triton_work = [(s, c) for s, c in work if _wants_triton(s, args.impl)]
    cuda_work = [(s, c) for s, c in work if _wants_cuda(s, args.impl)]
    gluon_work = [(_as_gluon(s), c) for s, c in work if _wants_gluon(s, args.impl)]
    if work and not triton_work and not cuda_work and not gluon_work:
        names = ", ".join(sorted({s.name for s, _ in work}))
        raise SystemExit(f"speedlight inspect: --impl {args.impl}: {names} run(s) CUDA C++ "
                         f"kernels, not Triton ones (--impl cuda)")
    if device.type == "cpu" and (triton_work or gluon_work):
        console.print(f"[dim]No GPU in use: kernels are compiled for {target.arch_name} without "
                      f"one; launches are captured under the Triton interpreter (recorded "
                      f"on meta tensors, none run, where a case is too large for it), sized "
                      f"for {sku.name} ({sku.sm_count} {target.sm_word}s).[/]")
    if cuda_work:
        console.print(f"[dim]CUDA C++ kernels: compiled with nvcc for {target.arch_name}; launch "
                      f"geometry from each op's launch sizing for {sku.name} ({sku.sm_count} "
                      f"SMs).[/]")
    reports = []
    if triton_work:
        from rich.progress import Progress

        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("capturing launches", total=len(triton_work))

            def advance(spec, case):
                progress.update(task, description=f"captured {spec.name} {case.label}")
                progress.advance(task)

            reports = inspect_cases(triton_work, target, device=device,
                                    compiler=TritonCompiler(jobs=args.jobs), mode=args.mode,
                                    backward=not args.no_backward, on_case=advance,
                                    smaller_case_bytes=args.mode in ("auto", "dry"))
    if gluon_work:  # no interpreter runs a Gluon kernel: launches recorded dry on a CPU
        reports += inspect_cases(gluon_work, target, device=device,
                                 compiler=TritonCompiler(jobs=args.jobs),
                                 mode="dry" if device.type != "cuda" else args.mode,
                                 backward=not args.no_backward, impl="gluon",
                                 smaller_case_bytes=False)
    reports += inspect_cuda_cases(cuda_work, target, backward=not args.no_backward)

    env = results.environment(device)
    run_id = uuid.uuid4().hex[:12]
    out_path = Path(args.out) / "inspect.jsonl"
    base = {"tool": "inspect", "run": run_id, **env}
    by_name = {s.name: s for s in specs}
    written = [row for r in reports for row in rows(r, base, _label(by_name[r.op], r.impl))]
    if args.json:
        import json

        for row in written:
            print(json.dumps(row, default=str))
    else:
        display.print_reports(reports, console, title=f"speedlight inspect for "
                              f"{target.arch_name} (launches sized for {sku.name}, "
                              f"{sku.sm_count} {target.sm_word}s)")
    results.append_jsonl(out_path, written)
    console.print(f"[dim]rows written to {out_path}[/]")
    if args.compare:
        _compare_files(args.compare[0], written, console, args.json)
    if args.dump:
        n = sum(_dump(r, Path(args.dump)) for r in reports)
        console.print(f"[dim]{n} kernels' TTIR, TTGIR, LLIR, PTX, cubin and SASS (CUDA C++: "
                      f"cubin and SASS) written under {args.dump}[/]")
    failed = [r for r in reports if r.error] + [k for r in reports for k in r.kernels
                                                 if k.error]
    if args.check:
        from rich.markup import escape

        held, info, errors = [], [], []
        for r in reports:
            if r.error:  # inspect could not read the case: an error, not the kernels' shortfall
                errors.append(r)
                continue
            h, i = guard.triage(by_name[r.op], r, r.sm_count)
            held += [(r, s) for s in h]
            info += [(r, s) for s in i]
        for r, s in info:
            console.print(f"[dim]below design where it does not apply ({r.case.label})[/] "
                          f"{escape(str(s))}", highlight=False)
        for r, s in held:
            console.print(f"[red]short of design[/] ({r.case.label}) {escape(str(s))}",
                          highlight=False)
        for r in errors:
            console.print(f"[bold red]error inspecting[/] {r.op} ({r.case.label}): "
                          f"{escape(r.error)}", highlight=False)
        skipped = sum(bool(r.skipped) for r in reports)
        console.print(f"--check: {len(reports) - len(errors) - skipped} case(s) inspected, "
                      f"{skipped} skipped (with their reasons), {len(errors)} could not be "
                      f"inspected (errors); {len(held)} shortfall(s) where a design applies "
                      f"(aligned rows); {len(info)} on shapes it does not cover, for "
                      f"information")
        if held or errors:
            return 1
    return 1 if failed else 0
