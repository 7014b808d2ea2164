"""The profile as one self-contained HTML page (jinja2 template, charts inlined as SVG)."""

from __future__ import annotations

from pathlib import Path

from speedlight import results
from speedlight.profile import charts, fmt

TEMPLATE = "profile.html.j2"


def _jinja():
    try:
        import jinja2
    except ImportError:
        raise RuntimeError("the HTML page needs jinja2 and matplotlib: "
                           "pip install 'speedlight[report]'") from None
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]),
                             trim_blocks=True, lstrip_blocks=True)
    env.filters.update(seconds=fmt.seconds, nbytes=fmt.nbytes, flops=fmt.flops, share=fmt.share,
                       ratio=fmt.ratio, count=fmt.count)
    env.globals["module_label"] = fmt.module_label
    return env


def render_page(doc: dict, top: int = 25) -> str:
    env = _jinja()
    uncounted: dict[str, list] = {}
    for r in doc["rows"]:
        if r["formula"] is None:
            uncounted.setdefault(r["op"], []).append(r)
    extra = {}
    if doc.get("comparison") or doc.get("variations"):
        from speedlight.profile import compare_charts
        if doc.get("comparison"):
            extra["targets_svg"] = compare_charts.targets_svg(doc)
        if doc.get("variations"):
            extra["variations_svg"] = compare_charts.variations_svg(doc)
    return env.get_template(TEMPLATE).render(
        doc=doc, top=top, root=doc["model"].get("class"), **extra,
        roofline_svg=charts.roofline_svg(doc), breakdown_svg=charts.breakdown_svg(doc),
        uncounted=sorted(uncounted.items(), key=lambda kv: -sum(r["time_s"] for r in kv[1])))


def write_page(doc: dict, path: str | Path, top: int = 25) -> Path:
    return results.write_atomic(path, render_page(doc, top))
