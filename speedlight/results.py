"""Results every tool writes: JSON lines, one row per (op, case, implementation), each
carrying the device, versions, git revision and time it was measured on.

Files are written atomically: a new version is written beside the old one and renamed
over it, so an interrupted run leaves the earlier results intact.
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import math
import os
import platform
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable

import torch


def _git_revision() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True,
                             text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def _driver_version() -> str | None:
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10)
        return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None
    except (OSError, subprocess.SubprocessError, IndexError):
        return None


@functools.lru_cache(maxsize=None)
def _static_environment() -> dict:
    import numpy
    import triton
    return {"torch": torch.__version__, "triton": triton.__version__, "numpy": numpy.__version__,
            "python": platform.python_version(), "cuda": torch.version.cuda,
            "driver": _driver_version() if torch.cuda.is_available() else None,
            "git": _git_revision(), "host": platform.node()}


def environment(device: torch.device | str) -> dict:
    """What a result row needs to say about where it was measured."""
    device = torch.device(device)
    env = dict(_static_environment())
    if device.type == "cuda":
        env["device"] = torch.cuda.get_device_name(device)
        env["runtime"] = "cuda"
    else:
        env["device"] = platform.processor() or platform.machine()
        env["runtime"] = "cpu-interpreter"
    env["timestamp"] = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return env


def _clean(value):
    """JSON has no NaN/Inf: write them as strings so rows stay valid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, torch.dtype):
        return str(value).replace("torch.", "")
    return value


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are ordinary files
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def write_json(path: str | os.PathLike, doc) -> Path:
    """One JSON document, NaN/Inf written as strings, atomically."""
    return write_atomic(path, json.dumps(_clean(doc), indent=1))


def make_console(width: int = 160):
    """A rich console as wide as the terminal, or `width` columns when output is not one
    (a log, CI), so tables are not folded to 80 columns."""
    from rich.console import Console
    c = Console()
    return c if c.is_terminal else Console(width=width)


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Append rows to a JSON-lines file atomically (old rows + new rows, then rename)."""
    path = Path(path)
    old = path.read_text() if path.exists() else ""
    if old and not old.endswith("\n"):
        old += "\n"
    new = "".join(json.dumps(_clean(r), sort_keys=False) + "\n" for r in rows)
    return write_atomic(path, old + new)


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{n}: not a JSON line ({e.msg})") from None
    return rows
