"""Render a report folder's stage files into index.html and summary.md, and the short
summary the terminal gets."""

from __future__ import annotations

from pathlib import Path

from speedlight.report import charts
from speedlight.report.load import failures, load_report
from speedlight.results import write_atomic


def _missing(x) -> bool:
    """None, or a value the template asked for that the stage file does not have."""
    return x is None or type(x).__name__ == "Undefined" or not isinstance(x, (int, float))


def fmt_time(s) -> str:
    if _missing(s):
        return "-"
    for unit, scale in (("s", 1), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(s) >= scale:
            return f"{s / scale:.3g} {unit}"
    return f"{s:.3g} s"


def fmt_us(us) -> str:
    return "-" if _missing(us) else fmt_time(us * 1e-6)


def fmt_bytes(n) -> str:
    if _missing(n):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.3g} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def fmt_x(x) -> str:
    return "-" if _missing(x) else f"{x:.2f}x"


def fmt_num(x, digits=3) -> str:
    return "-" if _missing(x) else f"{x:.{digits}g}"


def fmt_pct(x) -> str:
    return "-" if _missing(x) else f"{x:.1f}%"


def fmt_ratio(x) -> str:
    """A time ratio (speedlight / original) or an end of its interval."""
    return "-" if _missing(x) else f"{x:.3f}"


def change(before, after) -> str:
    if _missing(before) or before == 0 or _missing(after):
        return "-"
    return f"{after / before:.2f}x"


def versions_line(env: dict) -> str:
    """The versions a run used, as its header names them: torch, triton, transformers and
    CUDA ('none': a CPU build of torch; '?': a stage file that does not say)."""
    def named(key):
        if key not in env:
            return "?"
        return env[key] if env[key] is not None else "none"
    return (f"torch {named('torch')}, triton {named('triton')}, transformers "
            f"{named('transformers')}, CUDA {named('cuda')}")


def stage_files(manifest: dict) -> list[str]:
    """The files of the stages that ran and wrote one, in stage order."""
    return [s["file"] for s in manifest.get("stages", {}).values()
            if s.get("file") and s.get("status") == "ok"]


def md_link(name: str) -> str:
    return f"[{name}]({name})"


FILTERS = {"t": fmt_time, "us": fmt_us, "b": fmt_bytes, "x": fmt_x, "n": fmt_num, "pct": fmt_pct,
           "r": fmt_ratio, "md_link": md_link}


def _env():
    try:
        import jinja2
    except ImportError:
        raise RuntimeError("the HTML report needs jinja2: pip install 'speedlight[report]'") from None
    env = jinja2.Environment(loader=jinja2.PackageLoader("speedlight.report", "templates"),
                             # HTML pages escaped; summary.md.j2 is Markdown, where an
                             # escaped reason ("run&#39;s") would be printed as such
                             autoescape=jinja2.select_autoescape(["html", "html.j2"]),
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(FILTERS)
    env.globals.update(change=change, plan_line=plan_line, versions_line=versions_line,
                       stage_files=stage_files)
    return env


def _charts(data: dict) -> dict:
    out = {}
    for name, fn in (("time_by_type", charts.time_by_type), ("roofline", charts.roofline),
                     ("speedups", charts.speedups_by_op)):
        try:
            out[name] = fn(data)
        except RuntimeError as e:  # matplotlib missing: say so in the page
            out[name] = None
            out.setdefault("notes", []).append(str(e))
    return out


def render(folder: str | Path) -> dict[str, Path]:
    folder = Path(folder)
    data = load_report(folder)
    data["failures"] = failures(data)
    env = _env()
    html = env.get_template("report.html.j2").render(d=data, charts=_charts(data))
    md = env.get_template("summary.md.j2").render(d=data)
    return {"html": write_atomic(folder / "index.html", html),
            "md": write_atomic(folder / "summary.md", md)}


def has_failures(folder: str | Path) -> bool:
    return bool(failures(load_report(folder)))


def print_summary(folder: str | Path, console) -> None:
    d = load_report(folder)
    b, a = d["before"], d["after"]
    where = ("measured on " + d["environment"].get("device", "?") if d["representative"]
             else "CPU through the Triton interpreter: times are not representative")
    console.print(f"[bold]speedlight report[/]: {d['run'].get('model')} ({d['run'].get('mode')}), {where}")
    console.print(f"  {versions_line(d['environment'])}")
    if b and a:
        ratio = (change(b['step_time_s'], a['step_time_s']) if d["representative"]
                 else "not a speed: kernels interpreted")
        console.print(f"  step time  {fmt_time(b['step_time_s'])} -> {fmt_time(a['step_time_s'])}"
                      f" ({ratio});  peak memory "
                      f"{fmt_bytes(b['peak_bytes'])} -> {fmt_bytes(a['peak_bytes'])}")
        console.print(f"  sum of floors on {d['target'].get('name')}: {fmt_time(b['floor_s'])} -> "
                      f"{fmt_time(a['floor_s'])} ({d['measured'].get('floors')})")
    mc = d["model_check"]
    if mc:
        console.print(f"  patched model vs original: {'[green]matches[/]' if mc['passed'] else '[red]DIFFERS[/]'} "
                      f"({len(mc['checks'])} checks against the {mc['reference']}; worst ratio "
                      f"{fmt_num(mc['worst']['ratio'] if mc['worst'] else None)})")
        if mc.get("patch"):
            console.print(f"  decoder-layer fusion {mc['patch']['layer_fusion']} (the check ran "
                          "on it)")
    c = d["verify_counts"]
    console.print(f"  ops at the model's shapes: {c['pass']} passed, {c['fail'] + c['error']} failed, "
                  f"{c['skip']} skipped")
    for name, modes in d["speedup_means"].items():
        console.print(f"  geomean speedup over {name}: " +
                      ", ".join(f"{m} {fmt_x(v)}" for m, v in modes.items()))
    if d["speedups_withheld"]:
        console.print(f"  per-op speedups: none shown; {d['speedups_withheld']} rows were timed "
                      f"on the Triton interpreter on a CPU (not representative)")
    pl = d["plan"]
    if pl:
        console.print(f"  plan: {plan_line(pl)}")
    for f in failures(d):
        console.print(f"  [red]{f}[/]")


def plan_line(pl: dict) -> str:
    """The plan in one line: what was kept and dropped, or that nothing was timed."""
    c = pl["counts"]
    if not pl["timed"]:
        return (f"not timed ({pl['note']}); {c['unmeasured']} kinds applied unmeasured"
                + ("; projected floors only" if pl.get("projected") else ""))
    kept = [r["kind"] for r in pl["rows"] if r["verdict"] == "kept"]
    dropped = [r["kind"] for r in pl["rows"] if r["verdict"] == "dropped"]
    return (f"timed on {pl['key'].get('gpu')}: kept {', '.join(kept) or 'none'}; dropped "
            f"{', '.join(dropped) or 'none'}; {c['unmeasured']} unmeasured")
