"""`speedlight shape path/to/op.py:fn --shapes "x=[8,4096]:bf16,w=[4096]:bf16"`: the CLI."""

from __future__ import annotations

import argparse
from pathlib import Path

from speedlight import arguments


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("function", metavar="path/to/op.py:fn", help="the function to shape")
    p.add_argument("--shapes", required=True,
                   help='its inputs, in order: "x=[8,4096,4096]:bf16,w=[4096]:bf16" (dtype default fp32)')
    arguments.add_target(p)
    p.add_argument("--train", action="store_true", help="trace the backward too")
    p.add_argument("--out", default="speedlight-shape",
                   help="folder for shape.json, shape.html and the spec file (default speedlight-shape)")
    p.add_argument("--spec-out", default=None,
                   help="where to write the spec file (default <out>/<fn>_spec.py)")
    p.add_argument("--no-compile", action="store_true", help="do not ask torch.compile")
    p.add_argument("--no-html", action="store_true", help="skip the HTML page")
    p.add_argument("--top", type=int, default=30, help="aten ops shown in the terminal (default 30)")


def run(args: argparse.Namespace) -> int:
    from speedlight import results
    from speedlight.shape import render, shape
    from speedlight.shape.trace import load_function, parse_shapes

    console = results.make_console()
    try:
        if args.top < 0:
            raise ValueError(f"--top must be at least 0, got {args.top}")
        inputs = parse_shapes(args.shapes)
        fn, file, name = load_function(args.function)
        out = _writable("--out", args.out)
        spec_path = Path(args.spec_out) if args.spec_out else out / f"{name}_spec.py"
        if args.spec_out:
            if spec_path.is_dir():
                raise ValueError(f"--spec-out {args.spec_out!r} is a folder; name the file")
            _writable("--spec-out", spec_path.parent)
    except (ValueError, FileNotFoundError) as e:
        raise SystemExit(f"speedlight shape: {e}")
    tgt = arguments.resolve_target(args, "shape")
    try:
        doc = shape(fn, *inputs, target=tgt, train=args.train, spec_path=spec_path,
                    compile=not args.no_compile, source=(file, name))
    except (ValueError, TypeError) as e:
        raise SystemExit(f"speedlight shape: {e}")
    doc["environment"] = results.environment("cpu")
    render.print_shaping(doc, console, top=args.top)
    results.write_json(out / "shape.json", doc)
    console.print(f"[dim]wrote {out / 'shape.json'}[/]")
    if not args.no_html:
        try:
            results.write_atomic(out / "shape.html", render.render_html(doc))
            console.print(f"[dim]wrote {out / 'shape.html'}[/]")
        except RuntimeError as e:
            console.print(f"[yellow]{e}[/]")
    return 0


def _writable(flag: str, folder) -> Path:
    from speedlight import results

    try:
        return results.writable_folder(folder)
    except ValueError as e:
        raise ValueError(f"{flag}: {e}") from None
