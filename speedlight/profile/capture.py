"""Run a model's steps and record every aten op it dispatches.

Two kinds of profiled steps, after the warm-up:
- clean steps, timed without any recording (and on a GPU, traced by torch.profiler for
  kernel start/end times only): the step time, and the GPU's idle time between kernels,
  which the per-op recording would inflate;
- recorded steps, under torch.profiler and a TorchDispatchMode that sees every aten op
  below autograd with its shapes, dtypes, strides, the module it ran under and (in
  backward) the autograd node running it. Each op runs inside a profiler range of its
  own, so its time is joined to it exactly: the CUDA kernels launched inside the range on
  a GPU, the CPU time inside it on a CPU. The dispatch bookkeeping runs outside the range.

Backward ops are attributed to the module whose forward op created their autograd node
(by the node's sequence number), gradient accumulation to the parameter's module.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch.nn.modules.module import register_module_forward_hook, register_module_forward_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.weak import WeakIdKeyDictionary

from speedlight.ops._custom_op import around_launchers
from speedlight.workloads import costs
from speedlight.profile.memory import LiveMemory
from speedlight.spec import dtype_name

RANGE_PREFIX = "speedlight#"
_RecordFunctionFast = getattr(torch._C._profiler, "_RecordFunctionFast", None)


@dataclass
class ModuleCall:
    """One forward call of a module: which ops ran in it (innermost) and which autograd
    sequence numbers its forward allocated."""

    id: int
    module: str
    module_class: str
    depth: int
    seq_start: int
    seq_end: int | None = None
    input_producers: list = field(default_factory=list)


@dataclass
class OpRecord:
    index: int
    op: str  # aten.mm.default
    name: str  # mm
    phase: str  # forward, backward, optimizer, other
    module: str | None  # fqn of the innermost module ("" the root); None outside the model
    module_class: str | None
    call: int | None  # ModuleCall.id
    grad_fn: str | None  # the autograd node running a backward op
    fwd_index: int | None  # the forward op whose node that is
    inputs: list[dict]
    outputs: list[dict]
    scalars: str
    producers: list  # per tensor input: index of the op that produced it, or None
    cost: costs.OpCost | None
    cost_error: str | None = None
    mutates: bool = False
    saved_bytes: int = 0  # bytes of this op's outputs autograd saved for backward
    times: list = field(default_factory=list)  # seconds per recorded step
    host_times: list = field(default_factory=list)
    kernels: list = field(default_factory=list)  # (name, seconds) of the last step

    @property
    def time(self) -> float:
        return statistics.median(self.times) if self.times else 0.0

    @property
    def host_time(self) -> float:
        return statistics.median(self.host_times) if self.host_times else 0.0


def tensor_meta(t: torch.Tensor) -> dict:
    return {"shape": list(t.shape), "dtype": dtype_name(t.dtype), "stride": list(t.stride())}


def _scalars(bound: dict) -> str:
    parts = []
    for k, v in bound.items():
        if isinstance(v, torch.Tensor) or (isinstance(v, (list, tuple)) and v
                                           and all(isinstance(x, torch.Tensor) or x is None for x in v)):
            continue
        if v is None:
            continue
        parts.append(f"{k}={v}")
    text = ", ".join(parts)
    return text if len(text) <= 96 else text[:93] + "..."


def _is_composite(func, args, kwargs) -> bool:
    """Whether the op runs as its CompositeImplicitAutograd decomposition here: it has one,
    and no kernel of its own for the tensors' backend."""
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    name = func.name()
    if not has(name, "CompositeImplicitAutograd"):
        return False
    ts = costs.tensors((args, kwargs))
    backend = {"cuda": "CUDA", "cpu": "CPU", "meta": "Meta"}.get(ts[0].device.type, "CPU") if ts else "CPU"
    return not any(has(name, k) for k in (backend, "CompositeExplicitAutograd",
                                          "CompositeExplicitAutogradNonFunctional"))


class _InsideOp(TorchDispatchMode):
    """Under one of speedlight's custom ops (whose launcher's own ops the recorder does not
    see: it runs with the recorder popped): every storage its ops allocate, handed to the
    step's LiveMemory as temporaries of the op's module, so the peak counts a launcher's
    intermediates (a backward's g and dz), not only its outputs."""

    def __init__(self, memory: LiveMemory, module: str | None, producer: int):
        super().__init__()
        self.memory, self.module, self.producer = memory, module, producer

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if not func._schema.is_mutable and not func.is_view:
            outs = costs.tensors(out)
            if outs:
                self.memory.on_outputs(outs, costs.tensors((args, kwargs)), self.module,
                                       self.producer)
        return out


class OpRecorder(TorchDispatchMode):
    """Records each aten op of one step (see the module docstring)."""

    def __init__(self, names: dict[int, tuple[str, str]], param_owner: dict[int, tuple[str, str]],
                 memory: LiveMemory | None = None, timed: bool = True):
        super().__init__()
        self.names = names
        self.param_owner = param_owner
        self.memory = memory
        self.timed = timed and _RecordFunctionFast is not None
        self.ops: list[OpRecord] = []
        self.calls: list[ModuleCall] = []
        self.stack: list[ModuleCall] = []
        self.phase = "forward"
        self.seq_to_op: dict[int, int] = {}
        self.producer = WeakIdKeyDictionary()
        self.busy = False  # inside our own hooks: pass ops through unrecorded

    # -- module tracking -----------------------------------------------------------------
    def _name(self, mod) -> tuple[str, str]:
        return self.names.get(id(mod), (type(mod).__name__, type(mod).__name__))

    def _pre(self, mod, inputs):
        fqn, cls = self._name(mod)
        call = ModuleCall(len(self.calls), fqn, cls, len(self.stack),
                          torch._C._autograd._get_sequence_nr(),
                          input_producers=[self.producer.get(t) for t in costs.tensors(inputs)])
        self.calls.append(call)
        self.stack.append(call)

    def _post(self, mod, inputs, output):
        fqn, _ = self._name(mod)
        while self.stack:
            call = self.stack.pop()
            call.seq_end = torch._C._autograd._get_sequence_nr()
            if call.module == fqn:
                break

    @contextmanager
    def tracking_modules(self):
        pre = register_module_forward_pre_hook(self._pre)
        post = register_module_forward_hook(self._post, always_call=True)
        try:
            yield self
        finally:
            pre.remove()
            post.remove()

    def _backward_owner(self, node) -> tuple[str | None, str | None, int | None, int | None]:
        """(module, class, call, forward op) that a backward node belongs to."""
        if "AccumulateGrad" in node.name():
            fqn, cls = self.param_owner.get(id(getattr(node, "variable", None)), (None, None))
            return fqn, cls, None, None
        seq = node._sequence_nr()
        fwd = self.seq_to_op.get(seq)
        if fwd is not None:
            r = self.ops[fwd]
            return r.module, r.module_class, r.call, fwd
        inner = None
        for c in self.calls:  # innermost forward call whose sequence numbers hold it
            if c.seq_start <= seq < (c.seq_end if c.seq_end is not None else c.seq_start):
                if inner is None or c.depth > inner.depth:
                    inner = c
        if inner is None:
            return None, None, None, None
        return inner.module, inner.module_class, inner.id, None

    # -- the dispatch hook ---------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.busy:
            return func(*args, **kwargs)
        # Without autograd (inference_mode) composite ops such as linear reach this mode
        # whole; run their decomposition, which is what executes, so its ops are recorded.
        if _is_composite(func, args, kwargs):
            with self:  # the handler runs with this mode popped: re-enter it for the parts
                decomposed = func.decompose(*args, **kwargs)
            if decomposed is not NotImplemented:
                return decomposed
        index = len(self.ops)
        seq = torch._C._autograd._get_sequence_nr()
        inside = contextlib.nullcontext()
        own = self.memory is not None and func.namespace == "speedlight"
        if own:  # the launcher's own tensors, seen from inside it (ops/_custom_op.py)
            module = self._module_now()
            inside = around_launchers(lambda: _InsideOp(self.memory, module, index))
            self.memory.op_begin()
        with inside:
            if self.timed:
                with _RecordFunctionFast(f"{RANGE_PREFIX}{index}"):
                    out = func(*args, **kwargs)
            else:
                out = func(*args, **kwargs)
        if own:
            self.memory.op_end(func.overloadpacket.__name__, module)
        self.busy = True
        try:
            self._record(index, seq, func, args, kwargs, out)
        finally:
            self.busy = False
        return out

    def _module_now(self) -> str | None:
        """The module an op dispatched now belongs to (as _record attributes it)."""
        node = torch._C._current_autograd_node()
        if node is not None:
            return self._backward_owner(node)[0]
        top = self.stack[-1] if self.stack and self.phase == "forward" else None
        return top.module if top else None

    def _record(self, index, seq, func, args, kwargs, out):
        node = torch._C._current_autograd_node()
        grad_fn = fwd_index = None
        if node is not None:
            phase = "backward"
            grad_fn = node.name().replace("torch::autograd::", "")
            module, module_class, call, fwd_index = self._backward_owner(node)
        else:
            phase = self.phase
            top = self.stack[-1] if self.stack and phase == "forward" else None
            module, module_class, call = (top.module, top.module_class, top.id) if top else (None, None, None)
            if phase == "forward" and seq - 1 >= 0 and (seq - 1) not in self.seq_to_op:
                self.seq_to_op[seq - 1] = index  # the node this op created has number seq - 1
        ins = costs.tensors((args, kwargs))
        outs = costs.tensors(out)
        error = None
        try:
            cost = costs.estimate(func, args, kwargs, out)
        except Exception as e:  # a formula that cannot read these arguments: uncounted
            cost, error = None, f"{type(e).__name__}: {e}"
        mutates = func._schema.is_mutable
        rec = OpRecord(
            index=index, op=str(func), name=func.overloadpacket.__name__, phase=phase,
            module=module, module_class=module_class, call=call, grad_fn=grad_fn,
            fwd_index=fwd_index, inputs=[tensor_meta(t) for t in ins],
            outputs=[tensor_meta(t) for t in outs if not any(t is i for i in ins)],
            scalars=_scalars(costs.bind(func, args, kwargs)),
            producers=[self.producer.get(t) for t in ins], cost=cost, cost_error=error,
            mutates=mutates)
        self.ops.append(rec)
        for t in outs:
            self.producer[t] = index
        allocates = not mutates and not func.is_view and (
            cost is None or cost.formula not in ("view", "marker"))
        if self.memory is not None and outs and allocates:
            self.memory.on_outputs(outs, ins, module, index)

    # -- saved tensors -------------------------------------------------------------------
    def pack(self, t):
        self.busy = True
        try:
            if self.memory is not None:
                top = self.stack[-1] if self.stack else None
                producer, n = self.memory.on_saved(t, top.module if top else None,
                                                   top.module_class if top else None)
                if producer is not None and 0 <= producer < len(self.ops):
                    self.ops[producer].saved_bytes += n
            return t.detach()  # not t itself: a saved output would hold its own grad_fn
        finally:
            self.busy = False

    @staticmethod
    def unpack(t):
        return t


# ---------------------------------------------------------------------------------------
# running steps
# ---------------------------------------------------------------------------------------

@dataclass
class StepCapture:
    ops: list[OpRecord]
    calls: list[ModuleCall]
    device: str  # cpu or cuda
    step_times: list[float]  # wall seconds of the clean steps
    recorded_steps: int
    gpu: dict | None  # kernels, busy_s, idle_s, span_s of a clean step (medians), on CUDA
    memory: dict
    notes: list[str]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextmanager
def _silenced_stderr():
    """Point the process's stderr (fd 2) at /dev/null: libkineto prints a line on every
    profiler start and stop, which would interleave with the tables."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


@contextmanager
def _profiling(activities):
    from torch.profiler import profile

    prof = profile(activities=activities)
    with _silenced_stderr():
        prof.start()
    try:
        yield prof
    finally:
        with _silenced_stderr():
            prof.stop()


def _kernels(evt) -> list[tuple[str, float]]:
    found = [(k.name, k.duration * 1e-6) for k in evt.kernels]
    for child in evt.cpu_children:
        found += _kernels(child)
    return found


def _join_times(prof, ops: list[OpRecord], device: torch.device) -> None:
    """Give each op the time measured inside its profiler range."""
    by_index = {}
    for evt in prof.events():
        if evt.name.startswith(RANGE_PREFIX):
            by_index[int(evt.name[len(RANGE_PREFIX):])] = evt
    for rec in ops:
        evt = by_index.get(rec.index)
        if evt is None:
            continue
        host = evt.cpu_time_total * 1e-6
        rec.host_times.append(host)
        if device.type == "cuda":
            rec.kernels = _kernels(evt)
            parent = getattr(evt, "cpu_parent", None)
            if not rec.kernels and parent is not None and parent.kernels and \
                    sum(c.name.startswith(RANGE_PREFIX) for c in parent.cpu_children) == 1:
                # kernels correlated to the aten op around our range rather than to it
                rec.kernels = [(k.name, k.duration * 1e-6) for k in parent.kernels]
            rec.times.append(sum(d for _, d in rec.kernels))
        else:
            rec.times.append(host)


def _gpu_timeline(prof) -> dict:
    """Kernel count, busy time (union of kernel intervals), span and idle of one step."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type != torch.autograd.DeviceType.CPU)
    if not spans:
        return {"kernels": 0, "busy_s": 0.0, "span_s": 0.0, "idle_s": 0.0}
    busy, cur_s, cur_e = 0.0, spans[0][0], spans[0][1]
    for s, e in spans[1:]:
        if s > cur_e:
            busy += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    busy += cur_e - cur_s
    span = spans[-1][1] - spans[0][0]
    return {"kernels": len(spans), "busy_s": busy * 1e-6, "span_s": span * 1e-6,
            "idle_s": max(span - busy, 0.0) * 1e-6}


def capture(model: torch.nn.Module, step: Callable[[Callable[[str], None]], None], *,
            device: torch.device, warmup: int, steps: int, train: bool,
            optimizer: torch.optim.Optimizer | None = None, inputs=None) -> StepCapture:
    """Warm up, time `steps` clean steps, then record `steps` steps (see module docs).
    `step(phase)` runs one step, calling phase("forward"/"backward"/"optimizer") as it
    moves from one part to the next."""
    from torch.profiler import ProfilerActivity

    for _ in range(warmup):
        step(lambda p: None)
    _sync(device)

    notes: list[str] = []
    cuda = device.type == "cuda"
    step_times, timelines = [], []
    for _ in range(steps):
        if cuda:
            with _profiling([ProfilerActivity.CUDA]) as prof:
                t0 = time.perf_counter()
                step(lambda p: None)
                _sync(device)
                step_times.append(time.perf_counter() - t0)
            timelines.append(_gpu_timeline(prof))
        else:
            t0 = time.perf_counter()
            step(lambda p: None)
            step_times.append(time.perf_counter() - t0)

    names = {id(m): (fqn, type(m).__name__) for fqn, m in model.named_modules()}
    param_owner = {}
    for fqn, m in model.named_modules():
        for p in m.parameters(recurse=False):
            param_owner.setdefault(id(p), (fqn, type(m).__name__))
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    records: list[list[OpRecord]] = []
    recorder = None
    memory = None
    for _ in range(steps):
        memory = LiveMemory(model, optimizer, inputs, device)
        recorder = OpRecorder(names, param_owner, memory)
        grad_hooks = [p.register_post_accumulate_grad_hook(memory.on_grad)
                      for p in model.parameters() if p.requires_grad] if train else []

        def phase(p, r=recorder):
            r.phase = p

        try:
            with _profiling(activities) as prof:
                with recorder.tracking_modules(), recorder, \
                        torch.autograd.graph.saved_tensors_hooks(recorder.pack, recorder.unpack):
                    memory.start()
                    step(phase)
                    _sync(device)
                    memory.stop()
        finally:
            for h in grad_hooks:
                h.remove()
        _join_times(prof, recorder.ops, device)
        records.append(recorder.ops)

    ops = records[-1]
    if all([r.op for r in rs] == [r.op for r in ops] for rs in records):
        for rs in records[:-1]:
            for a, b in zip(rs, ops):
                b.times = a.times + b.times
                b.host_times = a.host_times + b.host_times
    else:
        notes.append("the recorded steps ran different op sequences; times are from the "
                     "last step only")
    gpu = None
    if timelines:
        gpu = {k: statistics.median(t[k] for t in timelines) for k in timelines[0]}
    return StepCapture(ops=ops, calls=recorder.calls, device=device.type,
                       step_times=step_times, recorded_steps=steps, gpu=gpu,
                       memory=memory.summary(), notes=notes)
