"""Numbers as a reader wants them: times, bytes, FLOPs and shares with their units; and
the terminal tables they go in."""

from __future__ import annotations

from rich.table import Table


def seconds(s: float | None) -> str:
    if s is None:
        return "-"
    if s == 0:
        return "0"
    a = abs(s)
    if a < 1e-6:
        return f"{s * 1e9:.1f} ns"
    if a < 1e-3:
        return f"{s * 1e6:.1f} µs"
    if a < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"


FLOP_UNITS = (("TFLOP", 1e12), ("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3))


def scaled(n: float | None, units: tuple[tuple[str, float], ...], unit: str, *,
           spec: str = ".2f", none: str = "-") -> str:
    """n in the largest of `units` (largest first) its size reaches, formatted with
    `spec`, else in whole `unit`s; `none` for None."""
    if n is None:
        return none
    for name, scale in units:
        if abs(n) >= scale:
            return f"{n / scale:{spec}} {name}"
    return f"{int(n)} {unit}"


def nbytes(n: float | None) -> str:
    return scaled(n, (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)), "B")


def flops(n: float | None) -> str:
    return scaled(n, FLOP_UNITS, "FLOP")


def share(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def ratio(x: float | None) -> str:
    return "-" if x is None else f"{x:.1f}x"


def module_label(module: str | None, root: str | None = None) -> str:
    """A module path for display: the root module by its class."""
    if module == "":
        return f"{root or 'model'} (root)"
    return module if module is not None else "-"


def count(n: float | None) -> str:
    """A large count: 2.75M, 8.03B."""
    if n is None:
        return "-"
    for unit, scale in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(int(n))


def table(title: str, *columns: str, right: tuple[str, ...] = ()) -> Table:
    """A left-titled rich table; the columns named in `right` right-justified."""
    t = Table(title=title, title_justify="left", pad_edge=False)
    for c in columns:
        t.add_column(c, justify="right" if c in right else "left", overflow="fold")
    return t
