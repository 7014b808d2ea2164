"""torch.compile's answer: the Triton kernels inductor generates for the function, read by
`speedlight inspect`.

Inductor writes Triton for CUDA tensors; on a machine without a GPU it writes Triton too
when asked to (`cpu_backend="triton"`), given a Triton driver that names the target GPU
(`_TargetDriver`: inductor only reads the target from it, to key its caches). Either way
each kernel inductor generates is taken as source (`AsyncCompile.triton` is replaced for
the duration), written as a plain `@triton.jit` module, and launched by speedlight with
the launch configuration inductor's own heuristics list first for the target GPU (on a GPU
inductor would time its candidates and keep the fastest; the count is reported). Those
launches are ordinary Triton launches, so inspect captures them as it captures speedlight's
own: on a CPU they run through the interpreter (bytes counted where the case is small
enough to run in full), and every kernel is compiled for the target's arch and read
(registers, spills, shared memory, access widths, tensor-core use). The bytes inductor's
plan moves are set against the fused floor: each kernel reads the buffers it loads from and
writes those it stores to (inductor's `in_ptr`, `out_ptr`, `in_out_ptr`s) once.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import importlib.util
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from speedlight.shape.trace import InputSpec

# a library kernel inductor calls instead of generating one: `extern_kernels.bmm(`
_EXTERN = re.compile(r"\bextern_kernels\.(\w+)\(")


@dataclass
class InductorKernel:
    """One kernel inductor generated: its plain Triton function, how inductor would launch
    it (heuristic and candidate configurations for the target), and its source file."""

    name: str
    jit_fn: object
    file: Path
    heuristic: str
    configs: list = field(default_factory=list)  # triton.Config candidates, inductor's order
    inductor_meta: dict = field(default_factory=dict)
    signature: dict = field(default_factory=dict)
    launches: int = 0

    def run(self, *args, stream=None, **_):
        """Launch as inductor's launcher would, with its first candidate configuration."""
        from torch._inductor.runtime.triton_heuristics import GridExpr

        cfg = self.configs[0]
        names = [n for n, t in self.signature.items() if t != "constexpr"]
        values = dict(zip(names, args))
        meta = {**{n: v for n, v in values.items() if isinstance(v, int)}, **cfg.kwargs}
        grid = GridExpr.from_meta(self.inductor_meta, cfg).eval_slow(meta)
        self.launches += 1
        return self.jit_fn[tuple(int(g) for g in grid)](
            *args, **cfg.kwargs, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


class _TargetDriver:
    """What inductor asks of Triton's active driver while it generates Triton on a machine
    without a GPU: the target (its caches are keyed by it). Nothing is launched through it."""

    def __init__(self, arch: int):
        from triton.backends.compiler import GPUTarget

        self.target = GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_active_torch_device(self):
        return torch.device("cpu")


def _device_properties(target):
    """inductor's DeviceProperties of the target GPU (its heuristics size blocks by them)."""
    from torch._inductor.runtime.hints import DeviceProperties

    arch = target.arch
    return DeviceProperties(type="cuda", index=0, multi_processor_count=target.sku.sm_count,
                            cc=arch, major=arch // 10,
                            regs_per_multiprocessor=target.sku.regs_per_sm,
                            max_threads_per_multi_processor=2048 if arch != 89 else 1536,
                            max_threads_per_block=1024, warp_size=32)


class _Heuristic:
    """Stands in for inductor's `triton_heuristics` module while a kernel's decorator is
    read: records which heuristic it names and with what arguments."""

    def __getattr__(self, kind):
        def record(*args, **kwargs):
            return (kind, args, kwargs)
        return record


def _plain_module(name: str, source: str, folder: Path):
    """Write inductor's kernel source as a plain @triton.jit module (its heuristics decorator
    and the CPU-driver switch taken out), import it, and return (module, decorator text)."""
    tree = ast.parse(source)
    decorator = None
    body = []
    for node in tree.body:
        if isinstance(node, ast.Expr) and "set_driver_to_cpu" in ast.unparse(node):
            continue
        if isinstance(node, ast.FunctionDef) and node.name == name:
            keep = []
            for d in node.decorator_list:
                if "triton_heuristics" in ast.unparse(d):
                    decorator = ast.unparse(d)
                else:
                    keep.append(d)
            node.decorator_list = keep
        body.append(node)
    tree.body = body
    text = ast.unparse(tree) + "\n"
    digest = hashlib.sha1(text.encode()).hexdigest()[:12]
    path = folder / f"{name}_{digest}.py"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".tmp{id(text)}")
        tmp.write_text(text)
        tmp.replace(path)
    module_name = f"speedlight_inductor_{name}_{digest}"
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        spec.loader.exec_module(module)
    return module, path, decorator


def _kernel(name: str, source: str, folder: Path, device_props) -> InductorKernel:
    from torch._inductor.runtime import triton_heuristics

    module, path, decorator = _plain_module(name, source, folder)
    if device_props is not None and hasattr(module, "libdevice"):
        from speedlight.shape import _libdevice  # the interpreter runs no libdevice call

        module.libdevice = _libdevice
    jit_fn = getattr(module, name)
    if decorator is None:
        raise RuntimeError(f"inductor kernel {name} has no heuristics decorator to launch it by")
    kind, args, kwargs = eval(decorator, {**vars(module), "triton_heuristics": _Heuristic()})
    triton_meta = dict(kwargs.get("triton_meta", {}))
    if device_props is not None:
        triton_meta["device"] = device_props
    kwargs = {**kwargs, "triton_meta": triton_meta}
    tuner = getattr(triton_heuristics, kind)(*args, **kwargs)(jit_fn)
    return InductorKernel(name, jit_fn, path, kind, list(tuner.configs),
                          dict(kwargs.get("inductor_meta", {})), dict(triton_meta["signature"]))


@contextlib.contextmanager
def generating_triton(target, folder: Path, on_gpu: bool):
    """While inside, torch.compile generates Triton kernels that speedlight launches
    (yields the InductorKernels and each graph's wrapper code as they are generated)."""
    import torch._inductor.config as inductor_config
    from torch._inductor.async_compile import AsyncCompile
    from torch._inductor.graph import GraphLowering

    kernels: list[InductorKernel] = []
    wrappers: list[str] = []  # each graph's wrapper code (forward first)
    props = None if on_gpu else _device_properties(target)

    def triton(self, kernel_name, source_code, device_str="cuda", **_):
        k = _kernel(kernel_name, source_code, folder, props)
        kernels.append(k)
        return k

    original, original_save = AsyncCompile.triton, GraphLowering.__dict__["save_output_code"]
    patches = {"fx_graph_cache": False, "compile_threads": 1}
    if not on_gpu:
        patches["cpu_backend"] = "triton"
    driver = previous = None
    if not on_gpu:
        from triton.runtime import driver
        previous = driver._active  # None until a driver was asked for (none exists here)
    torch._dynamo.reset()
    with inductor_config.patch(patches):
        AsyncCompile.triton = triton
        GraphLowering.save_output_code = staticmethod(wrappers.append)
        if driver is not None:
            driver.set_active(_TargetDriver(target.arch))
        try:
            yield kernels, wrappers
        finally:
            AsyncCompile.triton = original
            GraphLowering.save_output_code = original_save
            if driver is not None:
                driver._active = previous
            torch._dynamo.reset()


def _case_and_spec(fn: Callable, inputs: Sequence[InputSpec], train: bool, impl: Callable):
    """An OpSpec for inspect: inductor's kernels as the implementation, the function's
    traced fused cost as the cost, the given shapes as the one case."""
    from speedlight.shape.analysis import traced_cost
    from speedlight.spec import Case, OpSpec, rand_tensor

    name = getattr(fn, "__name__", "fn").strip("<>") or "fn"
    case = Case(f"inductor-{name}", {f"d{i}": d for i, d in enumerate(
        dict.fromkeys(d for s in inputs for d in s.shape))}, dtype=inputs[0].dtype)
    shapes = [(s.name, s.shape, s.dtype) for s in inputs]

    def make_inputs(c, device):
        out = {}
        for i, s in enumerate(inputs):
            if s.dtype.is_floating_point:
                out[s.name] = rand_tensor(s.shape, c, device, dtype=s.dtype, salt=i)
            else:
                g = torch.Generator().manual_seed(c.seed + i)
                out[s.name] = torch.randint(0, 2, s.shape, generator=g).to(device=device, dtype=s.dtype)
        return out

    grads = tuple(s.name for s in inputs if s.dtype.is_floating_point and s.dtype.itemsize >= 2) if train else ()
    spec = OpSpec(name=f"inductor-{name}", impl=lambda **kw: impl(*kw.values()),
                  reference=lambda **kw: fn(*kw.values()), make_inputs=make_inputs,
                  cost=lambda c, mode: traced_cost(fn, shapes, mode),
                  suites={"model": lambda: [case]}, grad_inputs=grads,
                  dtypes=(inputs[0].dtype,))
    return spec, case


def planned_bytes(launch, source: str) -> tuple[int, int]:
    """(read, written) bytes of one inductor launch as its source plans them: each pointer
    the kernel loads from read once, each it stores to written once (the address range
    of the tensor passed)."""
    read = written = 0
    for a in launch.args:
        if a.kind != "tensor":
            continue
        n = a.hi - a.lo
        if re.search(rf"\btl\.load\({a.name}\b", source):
            read += n
        if re.search(rf"\btl\.store\({a.name}\b", source):
            written += n
    return read, written


def inductor(fn: Callable, inputs: Sequence[InputSpec], *, train: bool, target=None,
             fused_bytes: dict | None = None) -> dict:
    """{'status': 'ran' | 'skipped' | 'failed', ...}: the kernels inductor generates for
    `fn` at these shapes, each compiled for the target and read by inspect, and the bytes
    its plan moves per phase beside the fused floor's (`fused_bytes`: phase -> bytes)."""
    from speedlight import target as target_mod
    from speedlight.hardware import cache_dir
    from speedlight.inspect.run import inspect_cases

    tgt = target if isinstance(target, target_mod.Target) else target_mod.resolve(target)
    on_gpu = torch.cuda.is_available()
    if not on_gpu:
        from speedlight.runtime import use_interpreter

        if not _interpreter_on():
            return {"status": "skipped",
                    "reason": "the Triton interpreter is off, so inductor's kernels cannot run "
                              "on CPU tensors here: run `speedlight shape` (the CLI sets it), or "
                              "set TRITON_INTERPRET=1 before importing speedlight"}
        use_interpreter()
    folder = cache_dir() / "inductor"
    try:
        with generating_triton(tgt, folder, on_gpu) as (kernels, wrappers):
            compiled = torch.compile(fn, dynamic=False)
            spec, case = _case_and_spec(fn, inputs, train, compiled)
            (report,) = inspect_cases([(spec, case)], tgt, device="cuda" if on_gpu else "cpu",
                                      backward=train)
    except Exception as e:  # the compiler's failure is the answer, not a crash of shape
        return {"status": "failed", "reason": f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"}
    if report.error or report.skipped:
        return {"status": "failed", "reason": report.error or report.skipped}
    by_name = {k.name: k for k in kernels}
    rows = []
    phases: dict[str, dict] = {}
    for kr in report.kernels:
        launch = kr.launch
        k = by_name.get(launch.kernel)
        read, written = planned_bytes(launch, k.file.read_text() if k else "")
        phase = "forward" if launch.direction == "fwd" else "backward"
        p = phases.setdefault(phase, {"launches": 0, "bytes": 0})
        p["launches"] += 1
        p["bytes"] += read + written
        rows.append({
            "phase": phase, "kernel": launch.kernel, "grid": list(launch.grid),
            "heuristic": k.heuristic if k else None,
            "config": dict(k.configs[0].kwargs) if k else {},
            "num_warps": launch.num_warps, "num_stages": launch.num_stages,
            "candidates": len(k.configs) if k else None,
            "read_bytes": read, "written_bytes": written,
            **_resources(kr),
        })
    for phase, p in phases.items():
        floor = (fused_bytes or {}).get(phase)
        p["fused_floor_bytes"] = floor
        p["bytes_over_floor"] = (p["bytes"] / floor) if floor else None
    extern: dict[str, int] = {}
    for code in wrappers:
        for call in _EXTERN.findall(code):
            extern[call] = extern.get(call, 0) + 1
    return {
        "status": "ran",
        "where": "GPU" if on_gpu else f"generated as Triton on this CPU, compiled for {tgt.arch_name}",
        "target": tgt.sku.name,
        "kernels": rows,
        "launches": len(rows),
        "extern_calls": extern,
        "phases": phases,
        "measured_bytes": [d.to_json() for d in report.directions],
        "findings": [f.to_json() for f in report.all_findings],
        "note": report.note or None,
        "config_note": ("each kernel launched with the first configuration inductor's "
                        "heuristics list for the target; on a GPU inductor times its "
                        "candidates and keeps the fastest"),
    }


def _resources(kr) -> dict:
    """What inspect read of one compiled kernel, in shape's JSON."""
    if not kr.ok:
        return {"error": kr.error}
    return {"registers": kr.registers, "spill_bytes": kr.spill_stores,  # bytes spilled
            "predicted": kr.predicted.to_json() if kr.predicted else
            {"predicted": True, "why": kr.unpredicted or "no prediction"},
            "smem": kr.smem, "occupancy": kr.occupancy.to_json(),
            "accesses": [{"kind": a.kind, "line": a.line, "source": a.source,
                          "possible_bits": a.possible_bits, "bits": a.bits}
                         for a in kr.accesses],
            "loaded": kr.launch.loaded if kr.launch.measured else None,
            "stored": kr.launch.stored if kr.launch.measured else None}


def _interpreter_on() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
