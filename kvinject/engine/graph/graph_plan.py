"""Where the hook claims llama.cpp's graph, learned from one graph.

Each layer ``il`` names the K it stores ``Kcur-il`` and the V ``Vcur-il``; consecutive nodes
share that name (projection, reshape, RoPE), and some architectures reuse it for a later run
(Gemma normalizes K under another name, then names the RoPE output ``Kcur-il`` again). The value
the cache write reads is the last node of the last run; a model that quantizes K before RoPE
(kvquant) has K changed at the node the layer's RoPE reads instead (:meth:`GraphPlan.learn`).

Learning records the runs of each name, the op that ends the last one, and what each node
reads. Every claim splits the graph, and a split costs a synchronization of the backend's
threads, so the hook claims one node per layer: the later of the layer's final K and V. The
earlier one is changed at that claim too, which is safe when no node between the two reads it
(checked here; otherwise it gets a claim of its own).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...exceptions import ModelError
from .. import ggml


@dataclass(frozen=True)
class GraphNode:
    """What learning records of one graph node: its address, name, op and the nodes it reads."""

    ptr: int
    name: bytes
    op: int
    reads: frozenset[int]

    @classmethod
    def read(cls, ptr: int) -> GraphNode:
        t = ggml.tensor(ptr)
        return cls(ptr, t.name, t.op, frozenset(p for p in (*t.src, t.view_src) if p))


@dataclass(frozen=True)
class GraphPlan:
    """Where to claim and what to change there, learned from one graph."""

    n_runs: dict[bytes, int]  # name -> how many runs of consecutive nodes carry it
    final_op: dict[bytes, int]  # name -> op of the node changed (the one the cache write reads, or RoPE reads)
    claims: dict[bytes, tuple[bytes, ...]]  # claimed name -> names changed at its claim, in graph order
    claim_run: dict[bytes, int] = field(default_factory=dict)  # name -> the run (from 1) that ends at that node

    @classmethod
    def learn(cls, nodes: list[GraphNode], sites: dict[bytes, tuple[str, int]], pre_rope: bool = False) -> GraphPlan:
        """The plan for a graph (nodes in evaluation order) and the targeted ``sites``
        (name -> (component, layer)); names not found in the graph are left out. With
        ``pre_rope``, K is changed where its first RoPE node reads it: a rope node starts a run,
        as in the compiled callback, and K may go by several names (the first given is its key)."""
        first = {site: name for name, site in reversed(sites.items())}
        key = {name: first[site] for name, site in sites.items()}
        ends: dict[bytes, list[int]] = {}  # name -> index of the last node of each run
        for i, node in enumerate(nodes):
            name = key.get(node.name)
            if name is None:
                continue
            after = nodes[i + 1] if i + 1 < len(nodes) else None
            if after is None or key.get(after.name) != name or (pre_rope and after.op == ggml.GGML_OP_ROPE):
                ends.setdefault(name, []).append(i)
        final = {name: idx[-1] for name, idx in ends.items()}
        claim_run = {name: len(idx) for name, idx in ends.items()}
        for name, idx in ends.items() if pre_rope else ():
            if sites[name][0] == "k":
                rope = next((i for i in idx if i + 1 < len(nodes) and nodes[i + 1].op == ggml.GGML_OP_ROPE and nodes[i].ptr in nodes[i + 1].reads), None)
                if rope is None:
                    raise ModelError(f"no RoPE node of this model's graph reads '{name.decode()}': K cannot be changed before RoPE (use site=post-rope)")
                final[name], claim_run[name] = rope, idx.index(rope) + 1
        layers: dict[int, list[bytes]] = {}
        for name in sorted(final, key=final.get):
            layers.setdefault(sites[name][1], []).append(name)
        claims: dict[bytes, tuple[bytes, ...]] = {}
        for names in layers.values():
            last, together = names[-1], []
            for name in names[:-1]:
                ptr = nodes[final[name]].ptr
                if any(ptr in node.reads for node in nodes[final[name] + 1 : final[last] + 1]):
                    claims[name] = (name,)  # read before the layer's last claim: change it at its own
                else:
                    together.append(name)
            claims[last] = (*together, last)
        return cls({n: len(idx) for n, idx in ends.items()}, {n: nodes[i].op for n, i in final.items()}, claims, claim_run)
