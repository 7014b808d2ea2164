"""Compile captured launches for a target GPU, present or not.

Each distinct kernel (same function, signature, constexprs, attributes, options and target)
is compiled once per process, in worker processes with the interpreter off (see
_worker.py); Triton's own on-disk cache makes a second run cheap. The target is a
speedlight.target.Target; for `--target native` (the GPU in use) the binaries the op's
launches actually compiled are read instead.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from speedlight.inspect.launches import Launch
from speedlight.target import Target

PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent.parent)


@dataclass
class Compiled:
    """One compiled kernel: its files on disk and what the compiler reported."""

    name: str
    target: Target
    files: dict = field(default_factory=dict)  # stage -> path (ttir ... ptx, cubin, sass; amdgcn, hsaco)
    meta: dict = field(default_factory=dict)
    error: str = ""

    def text(self, stage: str) -> str:
        path = self.files.get(stage)
        return Path(path).read_text() if path else ""

    @property
    def ptxas(self) -> dict:
        return self.meta.get("ptxas", {})

    @property
    def resources(self) -> dict:
        """The compiler's resource report: ptxas's (NVIDIA) or the AMDGCN assembler's
        (amdgcn.resources), both with registers, stack, spill_stores and spill_loads."""
        return self.meta.get("resources") or self.ptxas

    def dump(self, folder: Path, stem: str) -> list[Path]:
        """Copy every stage to folder/stem.<stage>."""
        folder.mkdir(parents=True, exist_ok=True)
        written = []
        for stage, path in sorted(self.files.items()):
            dest = folder / f"{stem}.{stage}"
            shutil.copyfile(path, dest)
            written.append(dest)
        return written


def _encode(v):
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction
    import triton.language as tl

    if isinstance(v, tl.dtype):
        return {"dtype": v.name}
    if isinstance(v, (JITFunction, InterpretedFunction)):
        import inspect

        fn = v.fn
        return {"fn": [os.path.abspath(inspect.getsourcefile(fn)), fn.__module__, fn.__qualname__]}
    if isinstance(v, tuple):
        return {"tuple": [_encode(x) for x in v]}
    if isinstance(v, tl.constexpr):
        return _encode(v.value)
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    raise TypeError(f"cannot pass constexpr {v!r} ({type(v).__name__}) to the compiler")


class TritonCompiler:
    """Compiles launches for targets, once per distinct kernel per process."""

    def __init__(self, jobs: int | None = None):
        self.jobs = jobs or max(1, min(4, os.cpu_count() or 1))
        self._done: dict[tuple, Compiled] = {}
        self._root = Path(tempfile.mkdtemp(prefix="speedlight-inspect-"))
        atexit.register(shutil.rmtree, self._root, True)

    def _folder(self, key: tuple) -> Path:
        return self._root / hashlib.sha1(repr(key).encode()).hexdigest()[:16]

    def compile(self, launches: list[Launch], target: Target) -> dict[tuple, Compiled]:
        """The compiled kernel of each launch, by launch.key(target.arch_name)."""
        out: dict[tuple, Compiled] = {}
        todo: dict[tuple, Launch] = {}
        for launch in launches:
            key = launch.key(target.arch_name)
            if key in self._done:
                out[key] = self._done[key]
            elif target.native:
                out[key] = self._done[key] = self._from_runtime(launch, target, key)
            else:
                todo.setdefault(key, launch)
        if todo:
            for key, compiled in self._run_workers(todo, target).items():
                self._done[key] = out[key] = compiled
        return out

    def _from_runtime(self, launch: Launch, target: Target, key: tuple) -> Compiled:
        from speedlight.inspect import _worker

        if launch.compiled is None:
            return Compiled(launch.kernel, target, error="the launch did not run compiled "
                            "(no CUDA runtime kernel to read)")
        try:
            write = _worker.write_amd_artifacts if target.vendor == "amd" else \
                _worker.write_artifacts
            files, meta = write(launch.compiled, self._folder(key), target.arch)
        except Exception as e:
            return Compiled(launch.kernel, target, error=f"{type(e).__name__}: {e}")
        return Compiled(meta.get("name", launch.kernel), target, files, meta)

    def _run_workers(self, todo: dict[tuple, Launch], target: Target) -> dict[tuple, Compiled]:
        names = {}
        requests = []
        for key, launch in todo.items():
            h = self._folder(key).name
            names[h] = (key, launch)
            requests.append({
                "key": h, "file": launch.file, "module": launch.module,
                "qualname": launch.qualname, "signature": launch.signature,
                "constexprs": [[list(p), _encode(v)] for p, v in launch.constexprs.items()],
                "attrs": [[list(p), a] for p, a in launch.attrs.items()],
                "options": launch.options, "arch": target.arch, "out": str(self._folder(key)),
                "sys_path": [p for p in sys.path if p and os.path.isdir(p)],
            })
        chunks = [requests[i::self.jobs] for i in range(min(self.jobs, len(requests)))]
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        procs = []
        for i, chunk in enumerate(chunks):
            result_path = self._root / f"results-{os.getpid()}-{id(chunk)}-{i}.jsonl"
            p = subprocess.Popen([sys.executable, "-m", "speedlight.inspect._worker",
                                  str(result_path)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                 env=env, cwd=PACKAGE_ROOT)
            procs.append((p, result_path, chunk))
        results: dict[tuple, Compiled] = {}
        for p, result_path, chunk in procs:
            stdout, stderr = p.communicate(json.dumps(chunk))
            got = {}
            if result_path.exists():
                for line in result_path.read_text().splitlines():
                    row = json.loads(line)
                    got[row["key"]] = row
            for req in chunk:
                key, launch = names[req["key"]]
                row = got.get(req["key"])
                if row is None:
                    tail = (stderr or stdout or "").strip().splitlines()[-3:]
                    results[key] = Compiled(launch.kernel, target, error="compile worker "
                                            f"exited {p.returncode}: {' / '.join(tail)}")
                elif "error" in row:
                    results[key] = Compiled(launch.kernel, target, error=row["error"])
                else:
                    results[key] = Compiled(row["meta"].get("name", launch.kernel), target,
                                            row["files"], row["meta"])
        return results
