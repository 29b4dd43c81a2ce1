"""A ProsQA graph's breadth-first search, shared by the ProsQA experiment scripts.

hops(edges, root) yields, hop by hop, the set of nodes first reached at that hop (the root's
children, then their children not yet reached, ...), and stops when a hop reaches nothing new.
Standard library only.
"""


def hops(edges, root):
    children = {}
    for a, b in edges:
        children.setdefault(a, []).append(b)
    reached, frontier = {root}, {root}
    while True:
        frontier = {c for node in frontier for c in children.get(node, [])} - reached
        if not frontier:
            return
        reached |= frontier
        yield frontier
