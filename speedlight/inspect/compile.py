"""Compile captured launches for a target GPU, present or not.

Each distinct kernel (same function, signature, constexprs, attributes, options and target)
is compiled once per process, in worker processes with the interpreter off (see
_worker.py), kept for the life of the process; Triton's own on-disk cache makes a second
run cheap. The target is a
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
import threading
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
        # the workers' environment, the pool's key: pytest's PYTEST_CURRENT_TEST, which
        # changes with every test, would start a pool per test
        env = {k: v for k, v in os.environ.items()
               if k != "TRITON_INTERPRET" and not k.startswith("PYTEST_")}
        env["PYTHONPATH"] = os.pathsep.join([PACKAGE_ROOT] + [p for p in env.get(
            "PYTHONPATH", "").split(os.pathsep) if p])
        results: dict[tuple, Compiled] = {}
        with _POOL_LOCK:
            workers = _workers(env, len(chunks))
            sent = []
            for i, (worker, chunk) in enumerate(zip(workers, chunks)):
                result_path = self._root / f"results-{os.getpid()}-{id(chunk)}-{i}.jsonl"
                worker.send(chunk, result_path)
                sent.append((worker, result_path, chunk))
            for worker, result_path, chunk in sent:
                finished = worker.finish()
                got = {}
                if result_path.exists():
                    for line in result_path.read_text().splitlines():
                        row = json.loads(line)
                        got[row["key"]] = row
                for req in chunk:
                    key, launch = names[req["key"]]
                    row = got.get(req["key"])
                    if row is None:
                        why = "" if finished else worker.why_stopped()
                        results[key] = Compiled(launch.kernel, target, error=why or
                                                "the compile worker returned no result")
                    elif "error" in row:
                        results[key] = Compiled(launch.kernel, target, error=row["error"])
                    else:
                        results[key] = Compiled(row["meta"].get("name", launch.kernel), target,
                                                row["files"], row["meta"])
        return results


class _Worker:
    """A compile worker process (_worker.py --serve), kept for the rest of this process's
    life: its imports (torch, Triton, the kernels' modules) are paid once, not once per
    compile call. It answers each batch of requests with a line on its stdout; what the
    compiler or a kernel's module prints goes to its log file."""

    def __init__(self, env: dict, folder: Path):
        folder.mkdir(parents=True, exist_ok=True)
        self.log = tempfile.NamedTemporaryFile("w+", dir=folder, prefix="worker-",
                                               suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "speedlight.inspect._worker",
                                      "--serve"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     env=env, cwd=PACKAGE_ROOT)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def send(self, requests: list[dict], result_path: Path) -> None:
        try:
            self.proc.stdin.write(json.dumps({"requests": requests,
                                              "results": str(result_path)}) + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass  # finish() reports the worker's end

    def finish(self) -> bool:
        """Waits for the batch's answer: False when the worker stopped instead."""
        return self.proc.stdout.readline() == "done\n"

    def why_stopped(self) -> str:
        code = self.proc.wait()
        self.log.flush()
        tail = Path(self.log.name).read_text(errors="replace").strip().splitlines()[-3:]
        return f"compile worker exited {code}: {' / '.join(tail)}"

    def close(self) -> None:
        if self.alive():
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
        self.log.close()


_POOL: dict = {"env": None, "workers": [], "folder": None}
_POOL_LOCK = threading.Lock()


def _workers(env: dict, n: int) -> list[_Worker]:
    """`n` live workers started with `env`: the pool's, with dead ones replaced; a pool
    started with another environment is closed first. The workers' folder is made on
    first use, and at exit the workers end before it goes."""
    if _POOL["folder"] is None:
        _POOL["folder"] = Path(tempfile.mkdtemp(prefix="speedlight-compile-workers-"))
        atexit.register(shutil.rmtree, _POOL["folder"], True)
        atexit.register(_close_pool)  # runs first
    if _POOL["env"] != env:
        _close_pool()
        _POOL["env"] = env
    live = [w for w in _POOL["workers"] if w.alive()]
    for w in _POOL["workers"]:
        if not w.alive():
            w.close()
    while len(live) < n:
        live.append(_Worker(env, _POOL["folder"]))
    _POOL["workers"] = live
    return live[:n]


def _close_pool() -> None:
    for w in _POOL["workers"]:
        w.close()
    _POOL["workers"] = []
