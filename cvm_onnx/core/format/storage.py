"""The storage plan the writer gives a graph: one storage id per entry, the runtime's buffer per id.

The runtime allocates one int32 buffer per storage id, sized by the largest entry using it, and refuses at load a
graph whose buffers total more than 2^32 bytes. The plan is ``storage_id[e] = e`` (every entry its own storage)
whenever that fits; otherwise storages are reused, by the rules of ``reuse_plan``.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

from ..graph import Entry, Node

#: The runtime's load-time bound on its storage (``CvmRuntime::GetStorageSize``): the bytes of every storage id,
#: each rounded up to 4 (int32 entries are), at most 2^32.
MAX_STORAGE = 1 << 32


def _outputs(nodes: Sequence[Node]) -> list[tuple[int, int]]:
    """Each written entry as (node index, output index), in entry order (a variable writes one entry)."""
    return [(i, k) for i, n in enumerate(nodes) for k in range(1 if n.is_variable else len(n.outputs))]


def _bytes(node: Node, k: int) -> int:
    return 4 * math.prod(node.outputs[k].shape)


def storage_plan(nodes: Sequence[Node], heads: Sequence[Entry]) -> list[int]:
    """The storage id of every entry (typed ``nodes``): the entry's index when the entries' bytes total at most
    ``MAX_STORAGE``, else ``reuse_plan``."""
    entries = _outputs(nodes)
    if sum(_bytes(nodes[i], k) for i, k in entries) <= MAX_STORAGE:
        return list(range(len(entries)))
    return reuse_plan(nodes, heads)


def reuse_plan(nodes: Sequence[Node], heads: Sequence[Entry]) -> list[int]:
    """Storage ids that reuse the storage of dead entries, walking the nodes in order.

    Each variable (input or param) has its own storage, never shared. An entry lives from the node writing it to
    its last reader (a head to the end; an entry nobody reads dies at its writer). A node's outputs take storages
    free before the node runs, so none shares storage with an input, a live entry or another output of the node
    (also for the runtime's in-place ops); the storages of entries that die at the node are freed after it. Each
    output takes the free storage of the smallest size that holds it, else grows the largest free one (the
    runtime sizes a storage by its largest user), else a new one; ties go to the lowest id.
    """
    entries = _outputs(nodes)
    index = {e: j for j, e in enumerate(entries)}
    end = [i for i, _ in entries]
    for i, node in enumerate(nodes):
        for e in node.inputs:
            if (j := index.get((e.node, e.index))) is not None:  # a broken reference: the writer's check names it
                end[j] = max(end[j], i)
    for h in heads:
        if (j := index.get((h.node, h.index))) is not None:
            end[j] = len(nodes)
    dying: dict[int, list[int]] = {}
    for j, (i, _) in enumerate(entries):
        if not nodes[i].is_variable and end[j] < len(nodes):
            dying.setdefault(end[j], []).append(j)
    sids = [0] * len(entries)
    sizes: list[int] = []
    free: set[int] = set()
    j = 0
    for i, node in enumerate(nodes):
        for k in range(1 if node.is_variable else len(node.outputs)):
            need = _bytes(node, k)
            if node.is_variable or not free:
                sid = len(sizes)
                sizes.append(need)
            else:
                fits = [s for s in free if sizes[s] >= need]
                sid = (min(fits, key=lambda s: (sizes[s], s)) if fits
                       else min(free, key=lambda s: (-sizes[s], s)))
                free.discard(sid)
                sizes[sid] = max(sizes[sid], need)
            sids[j] = sid
            j += 1
        free.update(sids[d] for d in dying.get(i, ()))
    return sids


def storage_bytes(nodes: Sequence[Node], sids: Sequence[int]) -> int:
    """The runtime's storage for a plan: per storage id, the bytes of its largest entry (int32 values)."""
    sizes: dict[int, int] = {}
    for (i, k), sid in zip(_outputs(nodes), sids):
        sizes[sid] = max(sizes.get(sid, 0), _bytes(nodes[i], k))
    return sum(sizes.values())
