"""Fail when any module of the repository imports itself back: an import circle.

``make lint`` runs it after import-linter. import-linter's ``acyclic_siblings``
contract (pyproject.toml) forbids circles between the children of one package;
this checks what that cannot see: circles that cross the top-level packages
(``webhook`` -> ``plugin`` -> ``webhook``) and circles through ``tests``. It
reads the import graph with grimp (import-linter's own graph library), so a
lazy import inside a function and an ``if TYPE_CHECKING:`` import count like
any other: a circle that only works because one side imports late is still
two modules that cannot be understood apart.

Usage: ``python scripts/check_import_cycles.py [PACKAGE ...]`` (default: every
first-party package). Exit status 0 when there is no circle, 1 when there is
one (each printed as ``a -> b -> a``), 2 when a package cannot be found.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Final

import grimp

REPO_ROOT: Final = Path(__file__).resolve().parent.parent
PACKAGES: Final = ("webhook", "plugin", "certs", "metagpu", "tests")


def import_graph(packages: Iterable[str]) -> dict[str, set[str]]:
    """Module -> the first-party modules it imports directly."""
    graph = grimp.build_graph(*packages, include_external_packages=False)
    return {
        module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules
    }


def find_cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """One circle per strongly connected component, as ``[a, b, ..., a]``.

    Tarjan's algorithm, iterative so a deep import chain cannot hit the
    recursion limit; each component is then shown as one concrete circle
    through its smallest module, so the output names real import lines.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(graph.get(root, ())))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, todo = work[-1]
            if todo:
                nxt = todo.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph.get(nxt, ()))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: set[str] = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1 or node in graph.get(node, ()):
                    components.append(component)
    return [_cycle_through(min(c), c, graph) for c in sorted(components, key=min)]


def _cycle_through(start: str, component: set[str], graph: Mapping[str, set[str]]) -> list[str]:
    """The shortest circle from ``start`` back to itself inside ``component`` (BFS)."""
    previous: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following: list[str] = []
        for node in frontier:
            for nxt in sorted(graph.get(node, set()) & component):
                if nxt == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(previous[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if nxt not in previous:
                    previous[nxt] = node
                    following.append(nxt)
        frontier = following
    raise AssertionError(f"{start} is in a strongly connected component but on no circle")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("packages", nargs="*", default=list(PACKAGES), metavar="PACKAGE")
    args = parser.parse_args(argv)
    if str(REPO_ROOT) not in sys.path:
        sys.path.insert(0, str(REPO_ROOT))
    try:
        graph = import_graph(args.packages)
    except (ModuleNotFoundError, ValueError) as exc:
        print(
            f"check_import_cycles: cannot read the packages {args.packages}: {exc}", file=sys.stderr
        )
        return 2
    cycles = find_cycles(graph)
    if not cycles:
        print(f"no import circles in {', '.join(args.packages)} ({len(graph)} modules)")
        return 0
    print(f"{len(cycles)} import circle(s); break each by moving what both sides need into a")
    print("module of its own, or by handing one side in as a parameter:")
    for cycle in cycles:
        print("  " + " -> ".join(cycle))
    return 1


if __name__ == "__main__":
    raise SystemExit(main())
