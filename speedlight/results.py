"""Results every tool writes: JSON lines, one row per (op, case, implementation), each
carrying the device, versions (torch, triton, transformers, CUDA: None where there is
none), git revision and time it was measured on.

Whole documents are written atomically (a new version beside the old one, renamed over
it); JSON-lines files are appended whole rows at a time under a lock. Either way an
interrupted run leaves the earlier results intact.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import platform
import subprocess
import tempfile
import warnings
from pathlib import Path
from typing import Iterable

import torch

try:
    import fcntl
except ImportError:  # Windows: no flock; appends are still whole O_APPEND writes
    fcntl = None


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

    from speedlight.versions import installed
    return {"torch": torch.__version__, "triton": triton.__version__,
            "transformers": installed("transformers"), "numpy": numpy.__version__,
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


def writable_folder(path: str | os.PathLike) -> Path:
    """path as a folder results can be written into, created if missing. ValueError saying
    why not (a file is there, a parent is a file, no permission), so a tool can refuse
    before doing any work rather than fail at its first write."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ValueError(f"{str(path)!r} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as e:
        raise ValueError(f"{str(path)!r} cannot be written: {e.strerror or e}") from None
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


class TornLineWarning(UserWarning):
    """A JSON-lines file ends in part of a row: its writer was killed mid-write."""


@contextlib.contextmanager
def _locked(fd: int, exclusive: bool):
    """An advisory lock on the whole file (flock), where the platform has one."""
    if fcntl is None:
        yield
        return
    fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
    try:
        yield
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _torn_tail(fd: int, size: int) -> tuple[int, bytes]:
    """(offset, bytes) of what follows the file's last newline (b"" when it ends in one)."""
    end, tail = size, b""
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        cut = chunk.rfind(b"\n")
        if cut >= 0:
            return start + cut + 1, chunk[cut + 1:] + tail
        tail, end = chunk + tail, start
    return 0, tail


def append_jsonl(path: str | os.PathLike, rows: Iterable[dict]) -> Path:
    """Append rows to a JSON-lines file, whole lines only, safe with other writers.

    Each call writes its rows with one O_APPEND write under an exclusive lock (flock), so
    two processes appending to one file interleave whole rows and lose none, and the rows
    already there are never read or written again. A writer killed mid-write leaves part
    of a line at the end: readers skip it (read_jsonl says so), and the next append drops
    it before writing, so the file is whole rows again.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(_clean(r), sort_keys=False) + "\n" for r in rows).encode()
    fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        with _locked(fd, exclusive=True):
            start, tail = _torn_tail(fd, os.fstat(fd).st_size)
            if tail and _parses(tail):
                data = b"\n" + data  # a whole last row written without its newline
            elif tail:
                os.ftruncate(fd, start)  # part of a row from a writer that was killed
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
    finally:
        os.close(fd)
    return path


def _parses(line: bytes) -> bool:
    try:
        json.loads(line)
        return True
    except ValueError:
        return False


def read_jsonl(path: str | os.PathLike) -> list[dict]:
    """The rows of a JSON-lines file. A last line cut short (a writer killed mid-write) is
    skipped with a TornLineWarning; any other line that is not JSON is a ValueError naming
    the file and line."""
    with open(path, "rb") as f, _locked(f.fileno(), exclusive=False):
        data = f.read()
    lines = data.split(b"\n")
    rows = []
    for n, line in enumerate(lines, 1):
        line = line.strip()
        if not line:
            continue
        try:
            row = json.loads(line)
        except ValueError as e:
            if n == len(lines):  # no newline after it: the row was never finished
                warnings.warn(f"{path}:{n}: skipped a torn last line ({len(line)} bytes): "
                              f"its writer was interrupted mid-row", TornLineWarning,
                              stacklevel=2)
                continue
            msg = e.msg if isinstance(e, json.JSONDecodeError) else str(e)
            raise ValueError(f"{path}:{n}: not a JSON line ({msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{n}: not a JSON object (got a {type(row).__name__}): "
                             f"each line of a results file is one row")
        rows.append(row)
    return rows
