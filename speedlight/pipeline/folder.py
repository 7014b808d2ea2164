"""The report folder: built beside `--out` and swapped in only when whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
from pathlib import Path

from speedlight.pipeline.stages import FILES, MANIFEST

# what a report folder holds, all written by speedlight: the stage files, the manifest,
# the projection's own page, and render's two
REPORT_FILES = frozenset([*FILES.values(), MANIFEST, "profile-projected.html", "index.html",
                          "summary.md"])


@contextlib.contextmanager
def built_beside(final: Path):
    """A new folder beside `final` to build the report in, which replaces `final` only when
    the block completes, so at every moment `final` holds a whole report, old or new.

    Refused up front (SystemExit) when `final` is a file or holds files speedlight did not
    write, which are never deleted. On an error or Ctrl-C the partial folder is removed and
    `final` is untouched; one left by a killed run is removed by the next run. The swap is
    one atomic exchange of the two folders where Linux offers it (renameat2), else two
    renames; then the old report's files, all speedlight's, are deleted.
    """
    final = final.resolve() if final.is_symlink() else final.absolute()
    if final.exists():
        if not final.is_dir():
            raise SystemExit(f"speedlight report: --out {str(final)!r} is a file, not a folder")
        foreign = sorted(p.name for p in final.iterdir() if p.name not in REPORT_FILES)
        if foreign:
            raise SystemExit(f"speedlight report: --out {str(final)!r} holds files speedlight "
                             f"did not write ({', '.join(foreign[:5])}): give a new folder, an "
                             f"empty one, or that of an earlier report")
    prefix = f".{final.name}.partial-"
    for stale in final.parent.glob(prefix + "*"):  # left by a run that was killed
        if stale.name[len(prefix):].isdigit() and not _alive(int(stale.name[len(prefix):])):
            shutil.rmtree(stale, ignore_errors=True)
    try:
        build = final.parent / f"{prefix}{os.getpid()}"
        build.mkdir(parents=True)
    except OSError as e:
        raise SystemExit(f"speedlight report: cannot write beside --out {str(final)!r}: "
                         f"{e.strerror or e}") from None
    try:
        yield build
    except BaseException:
        shutil.rmtree(build, ignore_errors=True)
        raise
    if final.exists() and _exchange(build, final):
        old = build  # the two folders traded places
    else:
        old = final.parent / f".{final.name}.old-{os.getpid()}"
        if final.exists():
            os.rename(final, old)
        try:
            os.rename(build, final)
        except OSError:
            if old.exists():
                os.rename(old, final)  # put the earlier report back
            raise
    for p in old.iterdir() if old.is_dir() else ():
        if p.name in REPORT_FILES and p.is_file():
            p.unlink()
    with contextlib.suppress(OSError):
        old.rmdir()  # fails, keeping them, if files speedlight did not write appeared


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def _exchange(a: Path, b: Path) -> bool:
    """Swap two folders atomically (Linux renameat2 RENAME_EXCHANGE); False where that is
    not available, and nothing moved."""
    if not sys.platform.startswith("linux"):
        return False
    import ctypes
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    at_fdcwd, rename_exchange = -100, 2
    return renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0
