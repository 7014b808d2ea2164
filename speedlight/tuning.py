"""Tuned tables: the launch configuration `speedlight tune` chose per (GPU SKU, op, shape
bucket), read by the ops at launch, so no autotuning ever runs in a user's step.

Where they live (one JSON file per SKU, `<sku>.json`, e.g. `h100-sxm.json`):
  shipped  speedlight/tuned/ in the package (filled by GPU sessions, may be empty)
  user     <cache>/tuned/, the cache being $SPEEDLIGHT_CACHE, else $XDG_CACHE_HOME/speedlight,
           else ~/.cache/speedlight (hardware.cache_dir); `speedlight tune` on a GPU writes here
A user's entry wins over the shipped entry of the same (op, bucket).

Format (FORMAT = 1):
    {"format": 1, "sku": "h100-sxm",
     "entries": {"matmul": {"m4096-n4096-k4096-bf16": {
         "config": {"BLOCK_M": 128, ...},   # what the launcher is given
         "impl": null,                      # reserved: the implementation to run (unused yet)
         "median_us": 512.3, "rule_us": 540.1, "verified": true, ...}}}}
Only "config" is read at launch; the rest records how the entry was chosen.

When they are read: lazily, on the first launch that asks (`lookup`), once per SKU per
process; never at import. A file that does not parse or does not have this shape is
ignored with a TunedTableWarning naming it and what is wrong, and the ops fall back to
their launch rules. `reload()` forgets what was read (after a tune run, or in tests).

Which SKU a launch reads: the SKU `for_sku` names when active (tune and inspect size a
CPU capture for a GPU with it), else the CUDA device's own (hardware.spec_for_device_name);
under the interpreter, none: launches there use the rule.
"""

from __future__ import annotations

import contextlib
import functools
import json
import threading
import warnings
from pathlib import Path
from typing import Any, Mapping

import torch

from speedlight import hardware

FORMAT = 1
SHIPPED_DIR = Path(__file__).resolve().parent / "tuned"


class TunedTableWarning(UserWarning):
    """A tuned table could not be used (it is ignored; the launch rule applies)."""


class TunedTableError(ValueError):
    """A tuned table does not have the documented shape."""


def user_dir() -> Path:
    return hardware.cache_dir() / "tuned"


def shipped_path(sku: str) -> Path:
    return SHIPPED_DIR / f"{sku}.json"


def user_path(sku: str) -> Path:
    return user_dir() / f"{sku}.json"


# --- which SKU a launch reads -------------------------------------------------------------

_FOR_SKU: list[str | None] = []


@contextlib.contextmanager
def for_sku(sku: str | None):
    """Inside, launches read the tuned tables of `sku` (a hardware.DEVICES key; None: no
    table, the launch rules), whatever device their tensors are on."""
    _FOR_SKU.append(sku)
    try:
        yield
    finally:
        _FOR_SKU.pop()


@functools.lru_cache(maxsize=None)
def _cuda_sku(index: int) -> str | None:
    try:
        return hardware.spec_for_device_name(torch.cuda.get_device_name(index)).key
    except KeyError:
        return None


def launch_sku(device: torch.device | str | None) -> str | None:
    """The SKU whose tables a launch on `device` reads (see the module docstring)."""
    if _FOR_SKU:
        return _FOR_SKU[-1]
    if device is None:
        return None
    device = torch.device(device)
    if device.type != "cuda":
        return None
    return _cuda_sku(device.index if device.index is not None else torch.cuda.current_device())


# --- reading ------------------------------------------------------------------------------

def parse(doc: Any, where: str = "table") -> dict[str, dict[str, dict]]:
    """The entries of a parsed table ({op: {bucket: entry}}), or TunedTableError saying
    what is wrong with it."""
    if not isinstance(doc, dict):
        raise TunedTableError(f"{where}: expected a JSON object, got {type(doc).__name__}")
    if doc.get("format") != FORMAT:
        raise TunedTableError(f"{where}: format {doc.get('format')!r}, this speedlight reads "
                              f"format {FORMAT}")
    entries = doc.get("entries")
    if not isinstance(entries, dict):
        raise TunedTableError(f"{where}: 'entries' must be an object {{op: {{bucket: entry}}}}")
    for op, buckets in entries.items():
        if not isinstance(buckets, dict):
            raise TunedTableError(f"{where}: entries[{op!r}] must be an object of buckets")
        for bucket, entry in buckets.items():
            if not isinstance(entry, dict) or not isinstance(entry.get("config"), dict):
                raise TunedTableError(f"{where}: entries[{op!r}][{bucket!r}] has no 'config' "
                                      f"object")
    return entries


def read(path: Path) -> dict[str, dict[str, dict]]:
    """The entries of the table at `path` ({} when there is none); a table that cannot be
    used warns (TunedTableWarning) and reads as {}."""
    if not path.is_file():
        return {}
    try:
        return parse(json.loads(path.read_text()), str(path))
    except TunedTableError as e:
        why = str(e)
    except (OSError, ValueError) as e:  # unreadable, or not JSON
        why = f"{path}: {e}"
    warnings.warn(f"speedlight: tuned table ignored, the launch rules apply instead: {why}",
                  TunedTableWarning, stacklevel=3)
    return {}


_LOADED: dict[str, dict[str, dict[str, dict]]] = {}
_SOURCES: dict[str, dict[tuple[str, str], str]] = {}  # sku -> (op, bucket) -> its file
_LOCK = threading.Lock()


def tables(sku: str) -> dict[str, dict[str, dict]]:
    """The entries of `sku`: the shipped table overlaid with the user's (read once)."""
    found = _LOADED.get(sku)
    if found is not None:
        return found
    with _LOCK:
        if sku not in _LOADED:
            merged: dict[str, dict[str, dict]] = {}
            sources: dict[tuple[str, str], str] = {}
            for path in (shipped_path(sku), user_path(sku)):
                for op, buckets in read(path).items():
                    merged.setdefault(op, {}).update(buckets)
                    sources.update({(op, bucket): str(path) for bucket in buckets})
            _SOURCES[sku] = sources
            _LOADED[sku] = merged
        return _LOADED[sku]


def lookup(op: str, bucket: str, device: torch.device | str | None) -> Mapping[str, Any] | None:
    """The tuned config of `op` for `bucket` on the SKU a launch on `device` reads, or None."""
    sku = launch_sku(device)
    if sku is None:
        return None
    entry = tables(sku).get(op, {}).get(bucket)
    return entry["config"] if entry is not None else None


def source(op: str, bucket: str, device: torch.device | str | None) -> str | None:
    """The file `op`'s tuned entry for `bucket` on `device`'s SKU was read from, or None."""
    sku = launch_sku(device)
    return _SOURCES.get(sku, {}).get((op, bucket)) if sku is not None else None


def reload() -> None:
    """Forget the tables read so far: the next launch reads the files again."""
    with _LOCK:
        _LOADED.clear()
        _SOURCES.clear()


# --- writing ------------------------------------------------------------------------------

def write(path: Path, sku: str, entries: Mapping[str, Mapping[str, dict]], *,
          merge: bool = True) -> Path:
    """Write `entries` ({op: {bucket: entry}}) as `sku`'s table at `path` (atomically),
    over the entries already there when merge (a table that cannot be read is replaced)."""
    from speedlight import results

    old: dict[str, dict[str, dict]] = {}
    if merge and path.is_file():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", TunedTableWarning)
            old = read(path)
    for op, buckets in entries.items():
        old.setdefault(op, {}).update(buckets)
    doc = {"format": FORMAT, "sku": sku,
           "entries": {op: dict(sorted(b.items())) for op, b in sorted(old.items())}}
    results.writable_folder(path.parent)
    return results.write_atomic(path, json.dumps(doc, indent=1, sort_keys=False) + "\n")
