"""Rich tables of what inspect found, for every kernel whichever compiler built it:
kernels, their global accesses, bytes moved, and the findings in plain words."""

from __future__ import annotations

import os
from typing import Sequence

from rich.console import Console
from rich.table import Table

from speedlight.inspect.case_report import CaseReport, KernelReport
from speedlight.spec import dtype_name

_SEVERITY = {"error": "bold red", "warn": "yellow", "info": "dim"}


def _widths(counter, op: str) -> str:
    return " ".join(f"{w}x{n}" for w, n in sorted(counter.items(), reverse=True)) or "-"


def _tc(k: KernelReport) -> str:
    parts = [f"{op} {n}" for op, n in sorted(k.mix.tensor_core.items())]
    parts += [f"{op} {n}" for op, n in sorted(k.mix.tma.items())]
    return ", ".join(parts) or "-"


def _bytes(n: int) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n} B"


def short_name(kernel: str) -> str:
    """_rms_norm_fwd_kernel -> rms_norm_fwd (for tables)."""
    name = kernel.lstrip("_")
    return name[: -len("_kernel")] if name.endswith("_kernel") else name


def _case_name(r: CaseReport) -> str:
    cuda = " (CUDA C++)" if r.impl == "cuda" else ""
    return f"{r.op} {r.case.label} {dtype_name(r.case.dtype)}{cuda}"


def kernel_table(reports: Sequence[CaseReport], *, title: str, with_case: bool) -> Table:
    t = Table(title=title, title_justify="left", pad_edge=False)
    matrix = any(k.mix and (k.mix.tensor_core or k.mix.tma) for r in reports for k in r.kernels)
    cols = (["case"] if with_case else []) + [
        "dir", "kernel", "grid", "warps", "regs", "spill", "smem", "occupancy", "waves",
        "LDG bits", "STG bits"] + (["MMA / TMA"] if matrix else []) + ["moved",
                                                                       "predicted"]
    right = {"warps", "regs", "spill", "smem", "waves", "moved", "predicted"}
    for c in cols:
        t.add_column(c, justify="right" if c in right else "left",
                     overflow="fold" if c in ("case", "kernel") else "ellipsis")
    for r in reports:
        for k in r.kernels:
            head = [f"{_case_name(r)}"] if with_case else []
            name = short_name(k.name) if with_case else k.name
            if k.error:
                t.add_row(*head, k.direction, name, k.grid_text, str(k.num_warps or "-"),
                          *["-"] * (len(cols) - len(head) - 5), "[bold red]compile failed[/]")
                continue
            occ = k.occupancy
            spill = f"[yellow]{k.spill_stores} B[/]" if k.spill_stores else "0"
            l = k.launch
            moved = _bytes(l.loaded + l.stored) if getattr(l, "measured", False) else "-"
            t.add_row(*head, k.direction, name, k.grid_text, str(k.num_warps), str(k.registers),
                      spill, _bytes(k.smem), f"{occ.fraction:.0%} ({occ.limiter})",
                      f"{k.waves.waves:.2f}", _widths(k.mix.global_loads, "LDG"),
                      _widths(k.mix.global_stores, "STG"), *([_tc(k)] if matrix else []), moved,
                      _predicted(k))
    return t


def _predicted(k: KernelReport) -> str:
    p = k.predicted
    return f"{p.us:,.1f} us {p.bound}" if p else "-"


def print_predictions(report: CaseReport, console: Console) -> None:
    """Each kernel's predicted time on the SKU and what bounds it, or why there is none."""
    said = False
    for k in report.kernels:
        if k.error:
            continue
        if not said:
            console.print(f"[bold]predicted on {report.device.name}[/] [dim](from the compiled "
                          f"code on a CPU, not measured; see docs/DESIGN-NOTES.md, "
                          f"\"Predicted\")[/]", highlight=False)
            said = True
        p = k.predicted
        if p is None:
            console.print(f"  {short_name(k.name)}: no prediction ({k.unpredicted})",
                          highlight=False, soft_wrap=True)
            continue
        segs = "; ".join(f"{x['where']}: {x['trips_mean']:g} x {x['cycles']:,.0f} cycles "
                         f"({x['bound']})" for x in p.parts["segments"])
        console.print(f"  {short_name(k.name)}: [bold]{p.us:,.1f} us[/], {p.bound}-bound "
                      f"({p.parts['programs_per_sm']} program(s) per SM, {p.parts['waves']} "
                      f"wave(s); {segs}; launch {p.parts['launch_us']:g} us)",
                      highlight=False, soft_wrap=True)


def _loop_name(k: KernelReport, lp) -> str:
    return f"{os.path.basename(lp.file)}:{lp.line}" if lp.file else f"loop {lp.index}"


def loops_table(report: CaseReport) -> Table | None:
    """Each kernel's loops: per iteration of one program, instructions per thread by pipe,
    MMA FLOPs and warp-instructions per MMA tile, loads and bytes in flight."""
    rows = [(k, lp) for k in report.kernels for lp in k.loops]
    if not rows:
        return None
    from speedlight.inspect.loops import MMA_TILE, PIPE_NAMES, PIPES

    used = [p for p in PIPES if any(lp.pipes.get(p) for _, lp in rows)]
    t = Table(title="loops (per iteration, per thread; * the steady-state loop; issue per MMA "
                    f"tile: warp-instructions per {'x'.join(map(str, MMA_TILE))} of MMA work)",
              title_justify="left", pad_edge=False)
    for c in ["kernel", "loop", "instr"] + [PIPE_NAMES[p] for p in used] + \
            ["MMA FLOPs", "issue / MMA tile", "loads B", "in flight B/SM"]:
        t.add_column(c, justify="left" if c in ("kernel", "loop") else "right",
                     overflow="fold" if c == "kernel" else "ellipsis")
    for k, lp in rows:
        flight = k.in_flight_per_sm() if lp.steady else 0
        t.add_row(short_name(k.name), ("* " if lp.steady else "") + _loop_name(k, lp),
                  str(lp.instructions), *[str(lp.pipes.get(p, 0) or "-") for p in used],
                  f"{lp.mma_flops:,}" if lp.mma_flops else "-",
                  f"{lp.per_mma_tile:,.0f}" if lp.per_mma_tile else "-",
                  str(lp.load_bytes or "-"),
                  (f"{flight:,}" + (" (prefetch)" if lp.prefetch else "")) if flight else "-")
    return t


def print_loop_lines(report: CaseReport, console: Console, top: int = 5) -> None:
    """The source lines the steady-state loop of each kernel spends its instructions on."""
    for k in report.kernels:
        lp = k.steady_loop
        if lp is None or not lp.instructions:
            continue
        console.print(f"  [bold]{short_name(k.name)}[/] steady-state loop {_loop_name(k, lp)}: "
                      f"{lp.instructions} instructions per iteration", highlight=False)
        for x in lp.lines[:top]:
            pipes = ", ".join(f"{n} {p}" for p, n in x.pipes.most_common(3))
            console.print(f"    {x.count / lp.instructions:4.0%} {os.path.basename(x.file)}:"
                          f"{x.line} ({x.count}: {pipes}) [dim]{x.source[:70]}[/]",
                          highlight=False, soft_wrap=True)


def access_table(report: CaseReport) -> Table:
    code = "AMDGCN" if report.target.vendor == "amd" else "SASS"
    t = Table(title=f"global loads and stores ({code} per source line; 'possible' = the "
                    f"widest access the addresses allow)", title_justify="left", pad_edge=False)
    for c in ("kernel", "line", "", "arg", "source", code, "possible", "row data"):
        t.add_column(c, overflow="fold" if c == "source" else "ellipsis")
    for k in report.kernels:
        for a in k.accesses:
            sass = a.sass.describe() if a.sass else "-"
            short = a.bits and a.row_data and a.bits < k.design.vector_bits
            role = ("yes" if a.row_data else "weights" if a.parameter else
                    "scalar (marked)" if a.scalar else "-")
            t.add_row(k.name, f"{os.path.basename(a.file)}:{a.line}", a.kind, a.arg,
                      a.source[:70], f"[yellow]{sass}[/]" if short else sass,
                      f"{a.possible_bits}-bit" if a.possible_bits else "-", role)
    return t


def bytes_table(reports: Sequence[CaseReport], *, with_case: bool) -> Table | None:
    rows = [(r, d) for r in reports for d in r.directions]
    if not rows:
        return None
    t = Table(title="bytes moved (interpreter: loads + stores, masked lanes excluded) vs the "
                    "OpSpec's compulsory bytes", title_justify="left", pad_edge=False)
    elsewhere = any(d.measured_on for _, d in rows)
    cols = (["case"] if with_case else []) + ["dir", "kernels", "moved", "compulsory",
                                              "ratio", "design allows"] + \
        (["compulsory at this size", "ratio measured on"] if elsewhere else [])
    for c in cols:
        t.add_column(c, justify="right" if c in ("moved", "compulsory", "ratio",
                                                  "design allows") else "left",
                     overflow="fold")
    for r, d in rows:
        head = [_case_name(r)] if with_case else []
        over = d.ratio > d.allowed + 1e-9
        ratio = f"[yellow]{d.ratio:.3f}[/]" if over else f"{d.ratio:.3f}"
        names = [short_name(k) for k in d.kernels] if with_case else d.kernels
        extra = [_bytes(d.size_compulsory) if d.measured_on else "", d.measured_on or "this case"]
        t.add_row(*head, d.direction, ", ".join(names), _bytes(d.measured),
                  _bytes(d.compulsory), ratio, f"{d.allowed:.2f}", *(extra if elsewhere else []))
    return t


def print_findings(reports: Sequence[CaseReport], console: Console, *, with_case: bool,
                   quiet_info: bool = False) -> None:
    """Every finding; with quiet_info, warnings and errors only and a count of the rest
    (they are all in the JSON rows)."""
    shown, hidden = 0, 0
    for r in reports:
        for f in r.all_findings:
            if quiet_info and f.severity == "info":
                hidden += 1
                continue
            if not shown:
                console.print("[bold]findings[/]")
            shown += 1
            where = f"{_case_name(r)}: " if with_case else ""
            kernel = f"{f.kernel}: " if f.kernel else ""
            console.print(f"  [{_SEVERITY.get(f.severity, '')}]{f.severity}[/] {where}"
                          f"{kernel}{f.text}", highlight=False, soft_wrap=True)
    if hidden:
        console.print(f"[dim]{hidden} informational findings (idle SMs, by-design traffic) are "
                      f"in the JSON rows[/]")
    elif not shown:
        console.print("[green]no findings[/]")


def print_case(report: CaseReport, console: Console) -> None:
    r = report
    what = (f" (CUDA C++, {os.path.basename(r.source)})" if r.impl == "cuda" and r.source
            else "")
    head = (f"speedlight inspect {r.op} {r.case.label} {dtype_name(r.case.dtype)}{what} for "
            f"{r.target.arch_name} (launches sized for {r.device.name}, {r.sm_count} "
            f"{r.target.sm_word}s)")
    if r.skipped:
        console.print(f"{head}: [yellow]skipped[/]: {r.skipped}")
        return
    if r.error:
        console.print(f"{head}: [bold red]error[/]: {r.error}")
        return
    if r.note:
        console.print(f"[dim]{r.note}[/]")
    if not r.kernels:
        console.print(f"{head}: {r.note}")
        return
    console.print(kernel_table([r], title=head, with_case=False))
    for k in r.kernels:
        if k.cuda:
            fn = k.function.demangled if k.function else "not in the binary"
            console.print(f"  [dim]{k.name}: {fn}[/]", highlight=False, soft_wrap=True)
            continue
        spec = ", ".join(_arg_spec(a) for a in k.launch.args)
        console.print(f"  [dim]{k.name} specialised as ({spec})[/]", highlight=False,
                      soft_wrap=True)
        if k.partitions:  # warp specialization: who does what, with how many registers
            workers = ", ".join(f"{w} warp{'s' if w > 1 else ''} at {r or '?'} registers"
                                for w, r in k.partitions)
            console.print(f"  [dim]{k.name} warp roles: the kernel's {k.launch.num_warps} "
                          f"warps (default partition) and workers of {workers}; USETMAXREG "
                          f"to {', '.join(map(str, k.setmaxnreg)) or 'none'}[/]",
                          highlight=False, soft_wrap=True)
    console.print(access_table(r))
    table = loops_table(r)
    if table is not None:
        console.print(table)
        print_loop_lines(r, console)
    print_predictions(r, console)
    table = bytes_table([r], with_case=False)
    if table is not None:
        console.print(table)
    print_findings([r], console, with_case=False)


def _arg_spec(a) -> str:
    if a.kind == "tensor":
        return f"{a.name}: *{a.dtype}{' D' if a.spec == 'D' else ''}"
    if a.kind == "constexpr":
        return f"{a.name}={a.value}"
    if a.kind == "int":
        return f"{a.name}: i{'' if a.spec != 'D' else ' D'}={a.value}"
    return f"{a.name}: {a.kind}"


def print_reports(reports: Sequence[CaseReport], console: Console, *, title: str) -> None:
    """One case in full (print_case), several as one table (print_cases_table)."""
    if len(reports) == 1:
        print_case(reports[0], console)
    elif reports:
        print_cases_table(reports, console, title=title)


def print_cases_table(reports: Sequence[CaseReport], console: Console, *, title: str) -> None:
    done = [r for r in reports if r.kernels]
    console.print(kernel_table(done, title=title, with_case=True))
    table = bytes_table(done, with_case=True)
    if table is not None:
        console.print(table)
    for r in reports:
        if r.skipped:
            console.print(f"[yellow]skipped[/] {r.op} {r.case.label}: {r.skipped}")
        if r.error:
            console.print(f"[bold red]error[/] {r.op} {r.case.label}: {r.error}")
    print_findings(done, console, with_case=True, quiet_info=True)
