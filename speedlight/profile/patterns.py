"""Find, in a recorded forward pass, the op chains that one speedlight op replaces.

Chains are found in the dataflow graph the recorder kept (each op's producers), through
views, and by module class where the class says what the module is (an RMSNorm module's
forward is one rms_norm whatever ops it takes). Each chain lists its forward ops; its
backward ops are those whose autograd node one of them created.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

_RMS_CLASS = re.compile(r"rms_?norm", re.I)
_LN_CLASS = re.compile(r"layer_?norm", re.I)


@dataclass
class Chain:
    op: str  # the speedlight op that replaces it
    pattern: str  # what was matched, in words
    fwd: set[int]  # indices of its forward ops
    module: str | None
    tensors: dict = field(default_factory=dict)  # boundary tensors (metas) the costs need
    note: str = ""
    external: set[int] = field(default_factory=set)  # ops whose outputs leave the chain


class Graph:
    """The forward ops of a profile with their producers and consumers."""

    def __init__(self, rows: list[dict]):
        self.rows = rows
        self.fwd = [r for r in rows if r["phase"] == "forward"]
        self.consumers: dict[int, list[int]] = {r["index"]: [] for r in rows}
        for r in self.fwd:
            for p in r["producers"]:
                if p is not None and p in self.consumers:
                    self.consumers[p].append(r["index"])

    def row(self, i: int) -> dict:
        return self.rows[i]

    def is_view(self, i: int) -> bool:
        return self.rows[i]["formula"] == "view"

    def base(self, i: int | None) -> int | None:
        """The op behind a tensor, looking through views."""
        while i is not None and self.is_view(i):
            ps = self.rows[i]["producers"]
            i = ps[0] if ps else None
        return i

    def input_base(self, i: int, k: int = 0) -> int | None:
        ps = self.rows[i]["producers"]
        return self.base(ps[k]) if k < len(ps) else None

    def views_between(self, src: int, dst: int) -> set[int]:
        """The view ops on the way from src's output to dst's inputs."""
        found: set[int] = set()
        for p in self.rows[dst]["producers"]:
            path = []
            while p is not None and p != src and self.is_view(p):
                path.append(p)
                ps = self.rows[p]["producers"]
                p = ps[0] if ps else None
            if p == src:
                found |= set(path)
        return found

    def uses(self, i: int) -> list[int]:
        """The non-view ops consuming i's output, looking through views."""
        out, todo, seen = [], list(self.consumers.get(i, [])), set()
        while todo:
            c = todo.pop(0)
            if c in seen:
                continue
            seen.add(c)
            if self.is_view(c):
                todo += self.consumers.get(c, [])
            else:
                out.append(c)
        return out


def _kernel_ops(g: Graph, idx) -> int:
    return sum(1 for i in idx if g.row(i)["launches_kernel"])


def _name(g: Graph, i: int | None) -> str | None:
    return g.row(i)["name"] if i is not None else None


def match_norms(g: Graph, calls) -> list[Chain]:
    """RMSNorm / LayerNorm module calls done in several ops, with the residual add that
    feeds them when there is one (add_rms_norm)."""
    chains = []
    by_call: dict[int, set[int]] = {}
    for r in g.fwd:
        if r["call"] is not None:
            by_call.setdefault(r["call"], set()).add(r["index"])
    for call in calls:
        ops = by_call.get(call.id, set())
        cls = call.module_class or ""
        rms = bool(_RMS_CLASS.search(cls))
        if not (rms or _LN_CLASS.search(cls)) or _kernel_ops(g, ops) < 2:
            continue
        first = min(ops)
        x = g.row(first)["inputs"][0]
        src = call.input_producers[0] if call.input_producers else None
        if src is not None and g.row(src)["outputs"]:
            x = g.row(src)["outputs"][0]
        weight = next((t for i in sorted(ops) for t, p in zip(g.row(i)["inputs"], g.row(i)["producers"])
                       if p is None and t["shape"] == x["shape"][-1:]), None)
        out = g.row(max(ops))["outputs"][0] if g.row(max(ops))["outputs"] else x
        offset = cls.lower().startswith("gemma")
        tensors = {"x": x, "weight": weight, "out": out}
        add = g.base(src)
        if rms and add is not None and _name(g, add) == "add" and len(g.row(add)["inputs"]) == 2 \
                and g.row(add)["inputs"][0]["shape"] == g.row(add)["inputs"][1]["shape"]:
            chains.append(Chain("add_rms_norm", f"residual add + {cls}", ops | {add} | g.views_between(add, first),
                                call.module, dict(tensors, residual=g.row(add)["inputs"][1]),
                                "offset=1 (Gemma's 1 + w)" if offset else ""))
        else:
            chains.append(Chain("rms_norm" if rms else "layer_norm", f"{cls} in {_kernel_ops(g, ops)} ops",
                                ops, call.module, tensors, "offset=1 (Gemma's 1 + w)" if offset else ""))
    return chains


def match_glu(g: Graph) -> list[Chain]:
    """act(gate) * up with act SiLU (swiglu) or GELU (geglu)."""
    chains = []
    for r in g.fwd:
        if r["name"] != "mul" or len(r["inputs"]) != 2 or r["inputs"][0]["shape"] != r["inputs"][1]["shape"]:
            continue
        for k in (0, 1):
            act = g.input_base(r["index"], k)
            if _name(g, act) not in ("silu", "gelu"):
                continue
            other = g.input_base(r["index"], 1 - k)
            if other is not None and other == g.input_base(act, 0):
                continue  # x * act(x) is an activation, not a gated unit
            op = "swiglu" if _name(g, act) == "silu" else "geglu"
            fwd = {act, r["index"]} | g.views_between(act, r["index"])
            chains.append(Chain(op, f"{_name(g, act)}(gate) * up", fwd, r["module"],
                                {"gate": g.row(act)["inputs"][0], "up": r["inputs"][1 - k],
                                 "out": r["outputs"][0]}))
            break
    return chains


def match_rope(g: Graph) -> list[Chain]:
    """x * cos + rotate(x) * sin, rotate being slices, neg and cat (or stack)."""
    chains = []
    for r in g.fwd:
        if r["name"] != "neg":
            continue
        x = g.input_base(r["index"], 0)
        cats = [c for c in g.uses(r["index"]) if _name(g, c) in ("cat", "stack")]
        for cat in cats:
            muls = [m for m in g.uses(cat) if _name(g, m) == "mul"]
            for mul_sin in muls:
                adds = [a for a in g.uses(mul_sin) if _name(g, a) == "add"]
                for add in adds:
                    other = [g.input_base(add, k) for k in (0, 1)]
                    mul_cos = next((m for m in other if m != mul_sin and _name(g, m) == "mul"), None)
                    if mul_cos is None or x not in [g.input_base(mul_cos, k) for k in (0, 1)]:
                        continue
                    kx = [g.input_base(mul_cos, k) for k in (0, 1)].index(x)
                    fwd = {r["index"], cat, mul_sin, add, mul_cos}
                    for a, b in ((cat, mul_sin), (mul_sin, add), (mul_cos, add), (r["index"], cat)):
                        fwd |= g.views_between(a, b)
                    fwd |= {p for p in g.row(r["index"])["producers"] + g.row(cat)["producers"]
                            if p is not None and g.is_view(p) and g.base(p) == x}
                    chains.append(Chain("rope", "x*cos + cat(-x2, x1)*sin", fwd, g.row(add)["module"], {
                        "x": g.row(mul_cos)["inputs"][kx], "cos": g.row(mul_cos)["inputs"][1 - kx],
                        "sin": next(t for t, p in zip(g.row(mul_sin)["inputs"], g.row(mul_sin)["producers"])
                                    if g.base(p) != cat), "out": g.row(add)["outputs"][0]}))
    return chains


def match_cross_entropy(g: Graph) -> list[Chain]:
    """(upcast) log_softmax + nll_loss, and the logits matmul before it (for the fused
    linear cross-entropy)."""
    chains = []
    for r in g.fwd:
        if r["name"] not in ("nll_loss_forward", "nll_loss2d_forward"):
            continue
        ls = g.input_base(r["index"], 0)
        if _name(g, ls) != "_log_softmax":
            continue
        fwd = {ls, r["index"]} | g.views_between(ls, r["index"])
        start = ls
        up = g.input_base(ls, 0)
        if _name(g, up) == "_to_copy":
            fwd |= {up} | g.views_between(up, ls)
            start = up
        logits = g.row(start)["inputs"][0]
        t = {"logits": logits, "target": r["inputs"][1]}
        chains.append(Chain("cross_entropy", "log_softmax + nll_loss" + (" after an fp32 upcast" if start != ls else ""),
                            fwd, r["module"], t))
        mm = g.input_base(start, 0)
        if _name(g, mm) in ("mm", "addmm"):
            h, w = g.row(mm)["inputs"][-2:]
            chains.append(Chain("linear_cross_entropy", "logits matmul + cross-entropy (logits never stored)",
                                fwd | {mm} | g.views_between(mm, start), g.row(mm)["module"],
                                dict(t, hidden=h, weight=w), "an alternative to cross_entropy, not in addition"))
    return chains


_SCORE_OPS = ("add", "mul", "div", "masked_fill", "_to_copy", "tanh", "where", "sub")


def match_attention(g: Graph) -> list[Chain]:
    """Eager attention: QKᵀ matmul, score ops (scale, mask, softcap), softmax, PV matmul."""
    chains = []
    for r in g.fwd:
        if r["name"] != "_softmax":
            continue
        fwd, i = {r["index"]}, g.input_base(r["index"], 0)
        for _ in range(8):
            if i is None or _name(g, i) not in _SCORE_OPS:
                break
            fwd.add(i)
            i = g.input_base(i, 0)
        if _name(g, i) not in ("bmm", "baddbmm"):
            continue
        qk = i
        j, pv = r["index"], None
        for _ in range(4):
            nxt = g.uses(j)
            if len(nxt) != 1:
                break
            j = nxt[0]
            if _name(g, j) in ("bmm",):
                pv = j
                break
            if _name(g, j) not in ("_to_copy", "native_dropout", "clone"):
                break
            fwd.add(j)
        if pv is None:
            continue
        fwd |= {qk, pv}
        for a in list(fwd):
            for p in g.row(a)["producers"]:
                if p is not None and g.is_view(p):
                    fwd.add(p)
        chains.append(Chain("attention", "eager attention (QKᵀ, softmax, PV materialize the scores)",
                            fwd, r["module"], {"q": g.row(qk)["inputs"][0], "k": g.row(qk)["inputs"][1],
                                               "v": g.row(pv)["inputs"][1], "out": g.row(pv)["outputs"][0],
                                               "scores": r["inputs"][0]}))
    return chains


_SDPA_OPS = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
             "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
             "_scaled_dot_product_fused_attention_overrideable")


def match_sdpa_attention(g: Graph) -> list[Chain]:
    """PyTorch's fused SDPA: already one kernel, so the bytes it saves are few; what
    speedlight.attention offers is its speed, which `speedlight bench --ops attention`
    measures against each SDPA backend."""
    chains = []
    for r in g.fwd:
        if r["name"] not in _SDPA_OPS or len(r["inputs"]) < 3 or not r["outputs"]:
            continue
        chains.append(Chain("attention", f"SDPA ({r['name'].lstrip('_')})", {r["index"]},
                            r["module"], {"q": r["inputs"][0], "k": r["inputs"][1],
                                          "v": r["inputs"][2], "out": r["outputs"][0]},
                            "already fused: the gain is kernel speed (speedlight bench --ops "
                            "attention compares it with each SDPA backend)"))
    return chains


def match_softmax(g: Graph, claimed: set[int]) -> list[Chain]:
    """A softmax with its casts, or spelled out as exp / sum / div, outside attention."""
    chains = []
    for r in g.fwd:
        i = r["index"]
        if i in claimed:
            continue
        if r["name"] == "_softmax":
            fwd = {i}
            up = g.input_base(i, 0)
            if _name(g, up) == "_to_copy":
                fwd.add(up)
            downs = [c for c in g.uses(i) if _name(g, c) == "_to_copy"]
            fwd |= set(downs[:1])
            if len(fwd) > 1:
                out = g.row(downs[0])["outputs"][0] if downs else r["outputs"][0]
                chains.append(Chain("softmax", "softmax with its dtype casts", fwd, r["module"],
                                    {"x": g.row(min(fwd))["inputs"][0], "out": out}))
        elif r["name"] == "div" and len(r["producers"]) == 2:
            e, s = g.input_base(i, 0), g.input_base(i, 1)
            if _name(g, e) == "exp" and _name(g, s) == "sum" and g.input_base(s, 0) == e:
                fwd = {e, s, i}
                sub = g.input_base(e, 0)
                if _name(g, sub) == "sub":
                    fwd.add(sub)
                    mx = g.input_base(sub, 1)
                    if _name(g, mx) in ("amax", "max"):
                        fwd.add(mx)
                chains.append(Chain("softmax", "softmax spelled out (exp, sum, div)", fwd, r["module"],
                                    {"x": g.row(min(fwd))["inputs"][0], "out": r["outputs"][0]}))
    return chains


def _gate_up_down(params: list[dict]) -> tuple[dict, dict] | None:
    """(gate_up_proj, down_proj) among 3-D parameter metas: [E, 2 I, H] and [E, H, I]."""
    for a in params:
        for b in params:
            (e, two_i, h), (e2, h2, i) = a["shape"], b["shape"]
            if e == e2 and two_i == 2 * i and h == h2 and a is not b:
                return a, b
    return None


def match_experts(g: Graph, calls) -> list[Chain]:
    """A mixture of experts' routed experts run as many ops (transformers 5.x's
    <Prefix>Experts: the per-expert loop, or a torch grouped_mm chain): a module call whose
    own ops read a gate_up_proj [E, 2 I, H] / down_proj [E, H, I] parameter pair, with every
    forward op under it (its act_fn too). A module already running speedlight's op is not
    one."""
    chains = []
    own: dict[int, list[dict]] = {}
    for r in g.fwd:
        if r["call"] is not None:
            own.setdefault(r["call"], []).append(r)
    for call in calls:
        params = {}
        for r in own.get(call.id, []):
            for t, p in zip(r["inputs"], r["producers"]):
                if p is None and len(t["shape"]) == 3:
                    params[tuple(t["shape"]), t["dtype"]] = t
        pair = _gate_up_down(list(params.values()))
        if pair is None:
            continue
        prefix = call.module
        rows = [r for r in g.fwd if r["module"] is not None
                and (r["module"] == prefix or r["module"].startswith(prefix + "."))]
        if any(r["op"].startswith("speedlight.") for r in rows):
            continue
        fwd = {r["index"] for r in rows}
        outside = [(t, p) for r in rows for t, p in zip(r["inputs"], r["producers"])
                   if p is None or p not in fwd]
        index = next((t for t, _ in outside if t["dtype"] == "int64" and len(t["shape"]) == 2
                      and t["shape"][1] <= pair[0]["shape"][0]), None)
        hidden = next((t for t, _ in outside if len(t["shape"]) == 2
                       and t["shape"][-1] == pair[0]["shape"][2] and t["dtype"] != "int64"), None)
        if index is None or hidden is None:
            continue
        how = "a torch grouped_mm chain" if any(r["name"] == "_grouped_mm" for r in rows) \
            else "a per-expert loop"
        chains.append(Chain("moe_experts", f"{call.module_class}: {how} in "
                            f"{_kernel_ops(g, fwd)} kernel ops", fwd, prefix,
                            {"hidden": hidden, "top_k_index": index, "gate_up_proj": pair[0],
                             "down_proj": pair[1]}))
    return chains


def find_chains(rows: list[dict], calls) -> list[Chain]:
    g = Graph(rows)
    moe = match_experts(g, calls)
    in_experts = set().union(*(c.fwd for c in moe)) if moe else set()
    # a gated unit inside an experts module is part of what moe_experts replaces
    chains = match_norms(g, calls) + [c for c in match_glu(g) if not c.fwd & in_experts] \
        + match_rope(g) + match_cross_entropy(g) + moe
    att = match_attention(g)
    claimed = set().union(*(c.fwd for c in att)) if att else set()
    chains += att + match_sdpa_attention(g) + match_softmax(g, claimed)
    for c in chains:
        c.external = {i for i in c.fwd if not g.is_view(i)
                      and (not g.uses(i) or any(u not in c.fwd for u in g.uses(i)))}
    return chains
