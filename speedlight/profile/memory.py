"""Where a step's memory goes: the bytes of the tensors alive at its peak, by what they are.

Measured from tensor lifetimes, not estimated from shapes: every storage an op allocates
during the recorded step is followed from its creation to its release (a weak reference on
the storage), so the live total at each op is known, and the largest is the peak. What was
alive before the step (parameters, buffers, optimizer state, inputs) is measured directly.
A storage changes category when autograd saves it for backward (an activation, belonging
to the module whose forward saved it) or when it becomes a parameter's gradient.

Storages are keyed by their StorageImpl (`UntypedStorage._cdata`), not their data pointer,
so the same bookkeeping follows the fake tensors of a projected step (which have no data).

What this does not see: allocator caching and fragmentation, workspaces libraries allocate
outside aten, and memory of other processes. On CUDA the caching allocator's own peak
(torch.cuda.max_memory_allocated) is reported beside it.
"""

from __future__ import annotations

import weakref
from collections import Counter

import torch

from speedlight.workloads.costs import tensors

CATEGORIES = ("parameters", "buffers", "optimizer_state", "inputs", "gradients",
              "activations", "temporaries")


def storage_key(st) -> int:
    """One key per live storage, shared by every view of it (fake tensors included)."""
    return st._cdata


def _storages(ts) -> dict[int, int]:
    """The distinct storages of these tensors: key -> bytes."""
    seen: dict[int, int] = {}
    for t in ts:
        if t is None or t.device.type == "meta":
            continue
        st = t.untyped_storage()
        if st.nbytes():
            seen[storage_key(st)] = st.nbytes()
    return seen


def _optimizer_state(optimizer) -> list[torch.Tensor]:
    if optimizer is None:
        return []
    return [v for st in optimizer.state.values() for v in st.values() if isinstance(v, torch.Tensor)]


class LiveMemory:
    def __init__(self, model: torch.nn.Module, optimizer, inputs, device: torch.device):
        self.model, self.optimizer, self.inputs, self.device = model, optimizer, inputs, device
        # key -> [bytes, category, module, producer op, the speedlight op running then or None]
        self.entries: dict[int, list] = {}
        self.ptr_key: dict[int, int] = {}
        self.live_by: Counter = Counter()  # (category, module) -> live bytes
        self.live = 0
        self.peak = 0
        self.peak_by: dict = {}
        self.saved_by_module: Counter = Counter()
        self.module_class: dict = {}
        self.grad_bytes = 0
        self.grad_untracked = 0
        self.running = False
        self._next = 0
        self.baseline: dict[str, int] = {}
        self.baseline_ptrs: set[int] = set()
        self.allocator_peak = None
        self.optimizer_state_after = 0
        # speedlight ops running now, innermost last: [bytes of theirs live, most at once]
        self._open: dict[int, list[int]] = {}
        self._next_op = 0
        self.op_peaks: dict[tuple[str, str | None], int] = {}

    def _measure_baseline(self) -> None:
        params = list(self.model.parameters())
        groups = {
            "parameters": params,
            "buffers": list(self.model.buffers()),
            "optimizer_state": _optimizer_state(self.optimizer),
            "inputs": tensors(self.inputs),
            "gradients": [p.grad for p in params if p.grad is not None],
        }
        self.baseline, self.baseline_ptrs = {}, set()
        for name, ts in groups.items():  # a storage counts in the first group holding it
            new = {ptr: n for ptr, n in _storages(ts).items() if ptr not in self.baseline_ptrs}
            self.baseline[name] = sum(new.values())
            self.baseline_ptrs |= set(new)

    def start(self) -> None:
        self._measure_baseline()
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.running = True

    def stop(self) -> None:
        self.running = False
        if self.device.type == "cuda":
            self.allocator_peak = torch.cuda.max_memory_allocated(self.device)
        self.optimizer_state_after = sum(_storages(_optimizer_state(self.optimizer)).values())

    # -- events from the recorder --------------------------------------------------------
    def on_outputs(self, outs, ins, module: str | None, producer: int) -> None:
        if not self.running:
            return
        in_ptrs = {storage_key(t.untyped_storage()) for t in ins if t.device.type != "meta"}
        for t in outs:
            if t.device.type == "meta":
                continue
            st = t.untyped_storage()
            ptr, n = storage_key(st), st.nbytes()
            if n == 0 or ptr in self.ptr_key or ptr in in_ptrs or ptr in self.baseline_ptrs:
                continue
            key = self._next
            self._next += 1
            op = next(reversed(self._open)) if self._open else None
            self.entries[key] = [n, "temporaries", module, producer, op]
            self.ptr_key[ptr] = key
            weakref.finalize(st, self._free, key, ptr)
            if op is not None:
                own = self._open[op]
                own[0] += n
                own[1] = max(own[1], own[0])
            self.live += n
            self.live_by["temporaries", module] += n
            self._update_peak()

    def _move(self, key: int, category: str, module) -> int:
        entry = self.entries[key]
        n, old_cat, old_mod = entry[:3]
        self.live_by[old_cat, old_mod] -= n
        self.live_by[category, module] += n
        entry[1], entry[2] = category, module
        return n

    def on_saved(self, t: torch.Tensor, module: str | None, module_class: str | None):
        """A tensor autograd saves for backward: (op that produced it, bytes newly saved)."""
        if t.device.type == "meta":
            return None, 0
        key = self.ptr_key.get(storage_key(t.untyped_storage()))
        if key is None or self.entries[key][1] != "temporaries":
            return None, 0
        n = self._move(key, "activations", module)
        self.saved_by_module[module] += n
        self.module_class[module] = module_class
        return self.entries[key][3], n

    def on_grad(self, p: torch.Tensor) -> None:
        if p.grad is None:
            return
        key = self.ptr_key.get(storage_key(p.grad.untyped_storage()))
        if key is None:
            self.grad_untracked += p.grad.untyped_storage().nbytes()
            return
        if self.entries[key][1] != "gradients":
            self.grad_bytes += self._move(key, "gradients", self.entries[key][2])

    def _free(self, key: int, ptr: int) -> None:
        entry = self.entries.pop(key, None)
        if entry is None:
            return
        if self.ptr_key.get(ptr) == key:
            del self.ptr_key[ptr]
        self.live -= entry[0]
        self.live_by[entry[1], entry[2]] -= entry[0]
        if entry[4] in self._open:
            self._open[entry[4]][0] -= entry[0]

    def op_begin(self) -> None:
        """One of speedlight's ops starts (its own allocations are tracked from inside)."""
        self._open[self._next_op] = [0, 0]
        self._next_op += 1

    def op_end(self, op: str, module: str | None) -> None:
        """It ended: the most bytes of its own (outputs and intermediates, what it
        allocated) it had live at once, kept per (op, module), the largest call."""
        _, most = self._open.pop(next(reversed(self._open)))
        self.op_peaks[op, module] = max(self.op_peaks.get((op, module), 0), most)

    def _update_peak(self) -> None:
        if self.live > self.peak:
            self.peak = self.live
            self.peak_by = {k: v for k, v in self.live_by.items() if v}

    # -- the result ----------------------------------------------------------------------
    def summary(self) -> dict:
        at_peak = {c: 0 for c in CATEGORIES}
        for c, n in self.baseline.items():
            at_peak[c] += n
        by_module: Counter = Counter()
        for (cat, module), n in self.peak_by.items():
            at_peak[cat] += n
            by_module[cat, module] += n
        total = sum(at_peak.values())
        notes = ["peak from tensor lifetimes at dispatch (allocator caching, fragmentation "
                 "and library workspaces not included; inside speedlight's ops, every "
                 "tensor their launchers make)"]
        if self.allocator_peak is not None:
            notes.append("allocator_peak_bytes is torch.cuda.max_memory_allocated over the step")
        if self.grad_untracked:
            notes.append(f"{self.grad_untracked} B of gradients were made outside the "
                         f"recorded ops")
        return {
            "peak_bytes": total,
            "allocator_peak_bytes": self.allocator_peak,
            "at_peak": at_peak,
            "parameters_bytes": self.baseline.get("parameters", 0),
            "buffers_bytes": self.baseline.get("buffers", 0),
            "optimizer_state_bytes": max(self.baseline.get("optimizer_state", 0),
                                         self.optimizer_state_after),
            "inputs_bytes": self.baseline.get("inputs", 0),
            "gradients_bytes": self.grad_bytes + self.grad_untracked,
            "activations_bytes": sum(self.saved_by_module.values()),
            "activations_by_module": [
                {"module": m, "module_class": self.module_class.get(m), "bytes": n}
                for m, n in self.saved_by_module.most_common()],
            "at_peak_by_module": [
                {"module": m, "category": c, "bytes": n}
                for (c, m), n in by_module.most_common() if c in ("activations", "temporaries")],
            "op_peaks": [
                {"op": op, "module": m, "bytes": n}
                for (op, m), n in sorted(self.op_peaks.items(), key=lambda kv: -kv[1])],
            "notes": notes,
        }
