"""Compile kernels for a target GPU in a process of its own, with the interpreter off.

Run as `python -m speedlight.inspect._worker --serve` (inspect's compiler keeps it for
the life of its process: main() says how it is spoken to). A process of its own because
the Triton interpreter, once it has run a kernel in a process, leaves triton.language
patched there,
and because under TRITON_INTERPRET=1 every @triton.jit function (the standard library's
too) is an interpreted function the compiler cannot call.

Each request names the kernel (file, module, qualname), the signature, constexprs and
attributes the runtime's binder derived, the launch options and the target; the worker
compiles with triton.compile (ASTSource, GPUTarget; a @gluon.jit kernel's
GluonASTSource), writes TTIR, TTGIR, LLIR, PTX, the
cubin and its SASS (nvdisasm with line info) to the request's folder, and reads ptxas's
resource report (registers, spills, stack) by running ptxas -v on the PTX; for an AMD
target (arch "gfx942"), the AMDGCN and HSACO, with the assembler's resource report.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import importlib.util
import io
import json
import os
import re
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path

STAGES = ("ttir", "ttgir", "llir", "ptx")


def tool(name: str) -> str:
    """A CUDA tool shipped with Triton's NVIDIA backend (ptxas, nvdisasm, cuobjdump)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.exists():
        raise FileNotFoundError(f"{name} not found at {path}: Triton's NVIDIA backend ships it")
    return str(path)


def decode(v):
    import triton.language as tl

    if isinstance(v, dict):
        if "dtype" in v:
            name = v["dtype"]
            return getattr(tl, name) if hasattr(tl, name) else tl.str_to_ty(name, None)
        if "fn" in v:
            return load_jit_function(*v["fn"])
        if "tuple" in v:
            return tuple(decode(x) for x in v["tuple"])
    return v


_MODULES: dict[str, object] = {}


def load_jit_function(file: str, module: str, qualname: str):
    """The JITFunction `qualname` of the module at `file` (imported by name when that
    resolves to the same file, else loaded from the path)."""
    from triton.runtime.jit import JITFunction

    mod = _MODULES.get(file)
    if mod is None:
        try:
            candidate = importlib.import_module(module) if module != "__main__" else None
            same = candidate is not None and os.path.samefile(candidate.__file__, file)
        except (ImportError, TypeError, OSError, ValueError):
            candidate, same = None, False
        if same:
            mod = candidate
        else:
            name = f"speedlight_inspect_{abs(hash(file))}"
            spec = importlib.util.spec_from_file_location(name, file)
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
            spec.loader.exec_module(mod)
        _MODULES[file] = mod
    obj = mod
    for part in qualname.split("."):
        obj = getattr(obj, part)
    while not isinstance(obj, JITFunction) and hasattr(obj, "fn"):
        obj = obj.fn  # autotune / heuristics wrappers
    if not isinstance(obj, JITFunction):
        raise TypeError(f"{qualname} in {file} is not a @triton.jit function")
    return obj


PTXAS_PATTERNS = {
    "registers": r"Used (\d+) registers",
    "stack": r"(\d+) bytes stack frame",
    "spill_stores": r"(\d+) bytes spill stores",
    "spill_loads": r"(\d+) bytes spill loads",
    "barriers": r"used (\d+) barriers",
    "smem_static": r"(\d+) bytes smem",
    "cmem0": r"(\d+) bytes cmem\[0\]",
}


def ptxas_report(ptx_path: Path, arch: int, fmad: bool, log: str = "") -> dict:
    """ptxas's resource report (registers, spills, stack): `log`, what ptxas printed when
    Triton compiled the kernel in this process (Triton's own flags, -v among them), else
    ptxas -v run again on the PTX with the flags Triton compiles with (a kernel Triton's
    on-disk cache served, or one a GPU compiled)."""
    if not re.search(PTXAS_PATTERNS["registers"], log):
        from triton.backends.nvidia.compiler import get_ptxas, sm_arch_from_capability

        cmd = [get_ptxas(arch).path, "-lineinfo", "-v", *([] if fmad else ["--fmad=false"]),
               f"--gpu-name={sm_arch_from_capability(arch)}", str(ptx_path), "-o", os.devnull]

        def run() -> tuple[str, bool]:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            return out.stderr + out.stdout, out.returncode == 0

        flags = f"\0{os.path.getsize(cmd[0])} {' '.join(cmd[1:-3])}".encode()
        log = _kept("ptxas", Path(ptx_path).read_bytes() + flags, run)
    report = {"log": log.strip()}
    for key, pattern in PTXAS_PATTERNS.items():
        m = re.search(pattern, log)
        report[key] = int(m.group(1)) if m else 0
    return report


def compile_one(req: dict) -> dict:
    import triton
    from triton.compiler import ASTSource, make_backend

    from speedlight.inspect.specialise import gpu_target

    fn = load_jit_function(req["file"], req["module"], req["qualname"])
    constexprs = {tuple(p): decode(v) for p, v in req["constexprs"]}
    attrs = {tuple(p): a for p, a in req["attrs"]}
    target = gpu_target(req["arch"])
    options = make_backend(target).parse_options(dict(req["options"]))
    if fn.is_gluon():  # a @gluon.jit kernel: its own front end, the same triton.compile
        from triton.experimental.gluon._runtime import GluonASTSource as ASTSource
    src = ASTSource(fn, req["signature"], constexprs, attrs)
    # Triton runs ptxas with -v and prints its log when asked: read there, the resource
    # report costs no second ptxas run (one when Triton's cache serves the kernel)
    printed = io.StringIO()
    with _knob(triton.knobs.nvidia, "dump_ptxas_log", True), \
            contextlib.redirect_stdout(printed):
        kernel = triton.compile(src, target=target, options=options.__dict__)
    if target.backend == "hip":
        files, meta = write_amd_artifacts(kernel, Path(req["out"]), req["arch"])
    else:
        files, meta = write_artifacts(kernel, Path(req["out"]), req["arch"],
                                      ptxas_log=printed.getvalue())
    return {"key": req["key"], "files": files, "meta": meta}


@contextlib.contextmanager
def _knob(group, name: str, value):
    """One of Triton's knobs set within, restored after."""
    saved = getattr(group, name)
    setattr(group, name, value)
    try:
        yield
    finally:
        setattr(group, name, saved)


def _write_stages(kernel, out: Path, stages, binary: str) -> tuple[str, dict]:
    """Write a CompiledKernel's text `stages` and its `binary` code object under `out`:
    (the kernel's name, stage -> path). A Gluon kernel has no TTIR (its front end makes
    TTGIR): a stage the compiler did not produce is left out."""
    out.mkdir(parents=True, exist_ok=True)
    name = kernel.metadata.name
    files = {}
    for stage in stages:
        if stage not in kernel.asm:
            continue
        path = out / f"{name}.{stage}"
        path.write_text(kernel.asm[stage])
        files[stage] = str(path)
    path = out / f"{name}.{binary}"
    path.write_bytes(kernel.asm[binary])
    files[binary] = str(path)
    return name, files


def _kept(kind: str, key: bytes, make) -> str:
    """make()'s text, kept in speedlight's cache (hardware.cache_dir()/kind) by `key`:
    computed once per key, whichever process or run asks. make() returns (text, whether
    to keep it: a tool's failure is not kept)."""
    from speedlight.hardware import cache_dir

    kept = cache_dir() / kind / f"{hashlib.sha256(key).hexdigest()[:40]}.txt"
    if kept.exists():
        return kept.read_text()
    text, keep = make()
    if not keep:
        return text
    try:  # written whole or not at all: another process may read it meanwhile
        kept.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=kept.parent, delete=False) as f:
            f.write(text)
        os.replace(f.name, kept)
    except OSError:
        pass  # a cache that cannot be written only costs the next reader the work
    return text


def disassembled(cubin: Path) -> str:
    """The cubin's SASS with line info (nvdisasm -c -gi), kept by the cubin's bytes:
    nvdisasm takes a third of a second of CPU per cubin, however small, and the same
    kernel is read again by every process and run that compiles it (Triton's own cache
    serves its cubin, not what it disassembles to)."""
    nvdisasm = tool("nvdisasm")

    def run() -> tuple[str, bool]:
        sass = subprocess.run([nvdisasm, "-c", "-gi", str(cubin)], capture_output=True,
                              text=True, timeout=300)
        if sass.returncode != 0:
            raise RuntimeError(f"nvdisasm failed: {sass.stderr.strip()}")
        return sass.stdout, True

    version = f"\0{os.path.getsize(nvdisasm)} -c -gi".encode()
    return _kept("sass", cubin.read_bytes() + version, run)


def write_artifacts(kernel, out: Path, arch: int, ptxas_log: str = "") -> tuple[dict, dict]:
    """Write a CompiledKernel's stages, cubin and SASS under `out`; return the file paths
    and the metadata inspect reads (shared memory, warps, ptxas's resource report: from
    `ptxas_log`, what ptxas printed compiling it, when there is one)."""
    name, files = _write_stages(kernel, out, STAGES, "cubin")
    (out / f"{name}.sass").write_text(disassembled(Path(files["cubin"])))
    files["sass"] = str(out / f"{name}.sass")
    meta = kernel.metadata._asdict()
    keep = {k: meta[k] for k in ("name", "num_warps", "num_ctas", "num_stages", "shared",
                                 "tmem_size", "global_scratch_size", "cluster_dims")
            if k in meta}
    keep["arch"] = arch
    fmad = bool(meta.get("enable_fp_fusion", True))
    keep["ptxas"] = ptxas_report(out / f"{name}.ptx", arch, fmad, ptxas_log)
    (out / "meta.json").write_text(json.dumps(keep, default=str, indent=1))
    return files, keep


def write_amd_artifacts(kernel, out: Path, arch: str) -> tuple[dict, dict]:
    """Write a CompiledKernel's stages for an AMD target (TTIR, TTGIR, LLIR, AMDGCN and
    the HSACO code object) under `out`; return the file paths and the metadata inspect
    reads (LDS, warps, the assembler's resource report: amdgcn.resources)."""
    from speedlight.inspect import amdgcn

    _, files = _write_stages(kernel, out, ("ttir", "ttgir", "llir", "amdgcn"), "hsaco")
    meta = kernel.metadata._asdict()
    keep = {k: meta[k] for k in ("name", "num_warps", "num_stages", "shared", "waves_per_eu",
                                 "matrix_instr_nonkdim", "kpack", "warp_size") if k in meta}
    keep["arch"] = arch
    keep["resources"] = amdgcn.resources(kernel.asm["amdgcn"])
    (out / "meta.json").write_text(json.dumps(keep, default=str, indent=1))
    return files, keep


@contextlib.contextmanager
def _diagnostics():
    """Inside, what the compiler's C++ passes print on stderr (MLIR diagnostics: why a
    pass failed) goes to a file; yields a list that holds its text afterwards."""
    said: list[str] = []
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+") as log:
        os.dup2(log.fileno(), 2)
        try:
            yield said
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            log.seek(0)
            said.append(log.read())


def _first_error(said: list[str]) -> str:
    """The first `error:` line of the compiler's diagnostics, shortened ('' for none)."""
    for line in "".join(said).splitlines():
        if "error:" in line:
            text = line.split("error:", 1)[1].strip()
            return text if len(text) <= 200 else text[:197] + "..."
    return ""


def _compile_batch(requests: list[dict], results_path: str) -> None:
    for path in requests[0].get("sys_path", []) if requests else []:
        if path not in sys.path:
            sys.path.append(path)
    with open(results_path, "w") as results:
        for req in requests:
            try:
                with _diagnostics() as said:
                    result = compile_one(req)
            except Exception as e:  # reported per kernel; the others still compile
                why = _first_error(said)
                result = {"key": req["key"], "error": f"{type(e).__name__}: {e}"
                          + (f" ({why})" if why else ""),
                          "traceback": traceback.format_exc(limit=6)}
            results.write(json.dumps(result, default=str) + "\n")
            results.flush()


def main() -> int:
    """`--serve`: each line of stdin a batch, {"requests": [...], "results": path}; the
    results are written to the path, one JSON line per request, then "done" on stdout,
    the channel (what a kernel's module or the compiler prints goes to stderr instead)."""
    os.environ.pop("TRITON_INTERPRET", None)
    if sys.argv[1:] != ["--serve"]:
        raise SystemExit("usage: python -m speedlight.inspect._worker --serve")
    channel = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # fd 1, and with it sys.stdout, now writes to stderr
    for line in iter(sys.stdin.readline, ""):
        batch = json.loads(line)
        _compile_batch(batch["requests"], batch["results"])
        channel.write("done\n")
        channel.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
