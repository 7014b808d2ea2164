"""Find, in a recorded forward pass, the op chains that one speedlight op replaces.

Each op says what it replaces: its OpSpec's `recognise(graph, calls)` walks the Graph
below (the dataflow the recorder kept: each op's producers and consumers, through views)
and the module calls (a module's class may say what it is: an RMSNorm module's forward is
one rms_norm whatever ops it takes), and returns its Chains, each with the Case of the call
that replaces it. A chain's backward ops are those whose autograd node one of its forward
ops created.
"""

from __future__ import annotations

import dataclasses

import torch

from speedlight.spec import Chain, parse_dtype


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

    def name(self, i: int | None) -> str | None:
        """The aten name of op i (None for None)."""
        return self.rows[i]["name"] if i is not None else None

    def kernel_ops(self, indices) -> int:
        """How many of the ops `indices` launch device work."""
        return sum(1 for i in indices if self.rows[i]["launches_kernel"])

    @staticmethod
    def tensor(meta: dict) -> torch.Tensor:
        """A recorded tensor (its shape, strides and dtype) as a meta tensor, which an op's
        case helpers read as they read a call's arguments."""
        name = meta["dtype"]
        try:
            dtype = parse_dtype(name)
        except ValueError:
            dtype = getattr(torch, name)
        return torch.empty_strided(meta["shape"], meta["stride"], dtype=dtype, device="meta")


def find_chains(rows: list[dict], calls, specs) -> list[Chain]:
    """Every chain the OpSpecs `specs` recognise in a profile's rows (with `calls`, the
    module calls), each named by its op; a chain sharing an op with a chain of an op in its
    `inside` is part of that one, and left out."""
    g = Graph(rows)
    found = [dataclasses.replace(c, op=spec.name)
             for spec in specs if spec.recognise is not None
             for c in spec.recognise(g, calls)]
    chains = [c for c in found
              if not any(o.op in c.inside and o.fwd & c.fwd for o in found if o is not c)]
    for c in chains:
        c.external = {i for i in c.fwd if not g.is_view(i)
                      and (not g.uses(i) or any(u not in c.fwd for u in g.uses(i)))}
    return chains
