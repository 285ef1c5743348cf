"""The KV-sharing map as a graph: cycles and chain roots in linear time.

Each sharer points at one target, so the map is a functional graph: every weakly connected
part is at most one cycle with trees hanging off it. One walk per node, each node visited
once, finds every cycle and, for every node off a cycle, the layer its chain ends at.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass
class SharingGraph:
    cycles: list[list[str]] = field(default_factory=list)
    """Each cycle once, starting at its member that comes first in the map's order."""
    on_cycle: dict[str, int] = field(default_factory=dict)
    """Sharer -> index into ``cycles``."""
    root: dict[str, str | None] = field(default_factory=dict)
    """Sharer off every cycle -> the first non-sharer its chain reaches (None: a cycle)."""


def analyse(sharers: Mapping[str, str]) -> SharingGraph:
    graph = SharingGraph()
    order = {name: i for i, name in enumerate(sharers)}
    state: dict[str, int] = {}  # 1: on the current walk, 2: finished
    for start in sharers:
        if start in state:
            continue
        path: list[str] = []
        node = start
        while node in sharers and node not in state:
            state[node] = 1
            path.append(node)
            node = sharers[node]
        if node in sharers and state[node] == 1:  # the walk closed a new cycle
            cycle = path[path.index(node) :]
            first = min(range(len(cycle)), key=lambda i: order[cycle[i]])
            cycle = cycle[first:] + cycle[:first]
            for member in cycle:
                graph.on_cycle[member] = len(graph.cycles)
            graph.cycles.append(cycle)
            tail = path[: path.index(node)]
            end: str | None = None
        elif node in sharers:  # reached a node finished earlier
            tail = path
            end = graph.root.get(node) if node not in graph.on_cycle else None
        else:  # reached a layer that shares nothing
            tail = path
            end = node
        for member in tail:
            graph.root[member] = end
        for member in path:
            state[member] = 2
    return graph
