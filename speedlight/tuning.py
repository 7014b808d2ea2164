"""Tuned tables and configuration spaces: the launch configuration `speedlight tune` chose per
(GPU SKU, op, shape bucket), read by the ops at launch, so no autotuning ever runs in a
user's step; and each op's space of configurations (`Configs`), which tune sweeps.

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

When they are read: lazily, on the first launch that asks (`speedlight.launch.config`,
through `Configs.tuned` and `lookup`), once per SKU per process; never at import. A file
that does not parse or does not have this shape is ignored with a TunedTableWarning naming
it and what is wrong, and the ops fall back to their launch rules. `reload()` forgets what
was read (after a tune run, or in tests).

Which SKU a launch reads: the launch context's target's (`speedlight.launch.for_target`:
tune and inspect size a CPU capture for a GPU with it), else the CUDA device's own
(`speedlight.launch.launch_sku`); under the interpreter, none: launches there use the rule.
"""

from __future__ import annotations

import json
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

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


# --- reading ------------------------------------------------------------------------------

def checked_entries(doc: Any, where: str = "table") -> dict[str, dict[str, dict]]:
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
        return checked_entries(json.loads(path.read_text()), str(path))
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


def lookup(op: str, bucket: str, sku: str | None) -> Mapping[str, Any] | None:
    """The tuned config of `op` for `bucket` in `sku`'s tables, or None (None for no SKU)."""
    if sku is None:
        return None
    entry = tables(sku).get(op, {}).get(bucket)
    return entry["config"] if entry is not None else None


def source(op: str, bucket: str, sku: str | None) -> str | None:
    """The file `op`'s tuned entry for `bucket` in `sku`'s tables was read from, or None."""
    return _SOURCES.get(sku, {}).get((op, bucket)) if sku is not None else None


def reload() -> None:
    """Forget the tables read so far: the next launch reads the files again."""
    with _LOCK:
        _LOADED.clear()
        _SOURCES.clear()


# --- configuration spaces ------------------------------------------------------------------

@dataclass(frozen=True)
class Configs:
    """The configuration space of op `op`'s kernels, for tuning: `space` maps each launch
    parameter (BLOCK_M, num_warps, num_stages...) to its candidate values (an NVIDIA
    GPU's space whole); `amd(gfx)` gives the parameters an AMD target adds for its LLVM
    arch ("gfx942": Triton's HIP options waves_per_eu, matrix_instr_nonkdim, kpack), so
    that `space_for(arch)` is the space of either vendor's target; `default(key)`
    is the launcher's own choice for a key (the key: what the launcher knows of the launch,
    its shape, dtype and GPU); `bucket(key)` names the tuned tables' entry a key falls in
    (a string such as "m4096-n4096-k4096-bf16": shapes that share one configuration;
    without it the tables are not read).

    A launcher asks `speedlight.launch.config(CONFIGS, key, device)`, which consults the
    launch context, then `tuned`, then `rule`; the op's OpSpec names it (`configs=`) for
    `speedlight tune`."""

    op: str
    space: Mapping[str, Sequence[Any]]
    default: Callable[[Any], Mapping[str, Any]] | None = None
    bucket: Callable[[Any], str] | None = None
    amd: Callable[[str], Mapping[str, Sequence[Any]]] | None = None
    _warned: set = field(default_factory=set, compare=False, repr=False)

    def space_for(self, arch: int | str | None) -> Mapping[str, Sequence[Any]]:
        """The space launches for `arch` take: `space`, with `amd(arch)`'s parameters
        after it for an AMD gfx name ("gfx942"); `space` alone for an NVIDIA compute
        capability (90) or None."""
        if isinstance(arch, str) and self.amd is not None:
            return {**self.space, **self.amd(arch)}
        return self.space

    def rule(self, key) -> Mapping[str, Any] | None:
        """The launcher's own choice for key (None without a default)."""
        return self.default(key) if self.default is not None else None

    def tuned(self, sku: str, key) -> Mapping[str, Any] | None:
        """The tuned tables' entry of `sku` for key's bucket, or None (no bucket, no entry,
        or an entry that is not a point of the space: warned once, the rule applies)."""
        if self.bucket is None:
            return None
        bucket = self.bucket(key)
        found = lookup(self.op, bucket, sku)
        if found is None or self._usable(bucket, found, sku):
            return found
        return None

    def _usable(self, bucket: str, config: Mapping[str, Any], sku: str) -> bool:
        gfx = getattr(hardware.DEVICES.get(sku), "gfx", "")  # an AMD SKU's arch
        space = self.space_for(gfx or None)
        if set(config) == set(space) and all(config[k] in space[k] for k in space):
            return True
        if bucket not in self._warned:
            self._warned.add(bucket)
            where = source(self.op, bucket, sku) or "the tuned table"
            warnings.warn(f"speedlight: {where}: the entry {bucket!r} of {self.op} is "
                          f"not a point of its configuration space ({dict(config)}; expected "
                          f"one value of each of {dict(space)}): ignored, the launch rule "
                          f"applies", TunedTableWarning, stacklevel=4)
        return False


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
