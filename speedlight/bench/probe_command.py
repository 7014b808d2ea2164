"""`speedlight probe`: measure this GPU's copy bandwidth and matmul rates, cache them for
every "% of speed-of-light" figure, and show them beside the datasheet's."""

from __future__ import annotations

import argparse

NO_GPU = ("speedlight probe: no CUDA GPU in use (torch sees none, or --device cpu was given). "
          "probe measures a GPU's copy bandwidth and matmul rates; nothing was measured or "
          "cached. Until it runs on the GPU, % of speed-of-light uses the datasheet numbers.")


def configure(p: argparse.ArgumentParser) -> None:
    p.add_argument("--copy-gib", type=float, default=None,
                   help="copy buffer size (default: 16x the L2, at least 1 GiB)")
    p.add_argument("--matmul-n", type=int, default=None,
                   help="measure one n x n x n matmul (default: the best of 8192 cubed and "
                        "Llama-3-8B's MLP projections at 4096 tokens)")
    p.add_argument("--dtypes", default="tf32,fp16,bf16,fp8", help="matmul dtypes to measure")
    p.add_argument("--no-save", action="store_true", help="measure and print, do not cache")


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    if torch.device(args.device).type != "cuda":
        print(NO_GPU, file=sys.stderr)
        return 2
    from rich.table import Table

    from speedlight import hardware, results
    from speedlight.bench import probe
    from speedlight.bench.display import CONSOLE_WIDTH

    device = torch.device(args.device)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bad = [d for d in dtypes if d not in probe.MATMUL_DTYPES]
    if bad:
        raise SystemExit(f"speedlight probe: unknown dtype(s) {', '.join(bad)}; "
                         f"known: {', '.join(probe.MATMUL_DTYPES)}")
    if args.copy_gib is not None and args.copy_gib <= 0:
        raise SystemExit(f"speedlight probe: --copy-gib must be more than 0, got {args.copy_gib:g}")
    if args.matmul_n is not None and args.matmul_n < 1:
        raise SystemExit(f"speedlight probe: --matmul-n must be at least 1, got {args.matmul_n}")
    copy_bytes = int(args.copy_gib * 2 ** 30) if args.copy_gib else None
    ceilings, readings = probe.probe(device, copy_bytes=copy_bytes, matmul_n=args.matmul_n,
                                     dtypes=dtypes)
    spec = hardware.current_device_spec()
    console = results.make_console(CONSOLE_WIDTH)
    t = Table(title=f"speedlight probe: {ceilings.device_name}, driver {ceilings.driver}",
              title_justify="left", pad_edge=False)
    for col in ("ceiling", "measured", "datasheet", "measured / datasheet", "size", "note"):
        t.add_column(col, justify="right" if col in ("measured", "datasheet", "measured / datasheet") else "left")
    for r in readings:
        if r.what == "copy":
            name, unit, scale = "copy bandwidth (read + write)", "GB/s", 1e9
            sheet = spec.dram_bandwidth if spec else None
        else:
            name, unit, scale = f"dense matmul {r.what}", "TFLOP/s", 1e12
            sheet = spec.peak_flops.get(r.what) if spec else None
        measured = f"{r.value / scale:.4g} {unit}" if r.value is not None else "-"
        sheet_s = f"{sheet / scale:.4g} {unit}" if sheet else "-"
        ratio = f"{100 * r.value / sheet:.0f}%" if sheet and r.value else "-"
        t.add_row(name, measured, sheet_s, ratio, r.size, r.note)
    console.print(t)
    if spec is None:
        console.print("[yellow]no DeviceSpec in speedlight.hardware for this device: no datasheet "
                      "numbers to compare with[/]")
    if args.no_save:
        console.print("not cached (--no-save)")
    else:
        path = hardware.save_ceilings(ceilings)
        console.print(f"cached: {path} (bench, inspect and profile use these ceilings)")
    return 0
