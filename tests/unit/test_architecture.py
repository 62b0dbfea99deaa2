"""The house's rules that import-linter cannot state: no import circle between any two modules, and raw Kubernetes
JSON read only at the edges.

import-linter's layer contracts keep imports flowing down, and its acyclic contract keeps each package free of
circles, but the composition layer of the scheduler is a set of sibling modules that may import each other, and a
circle among them (or one that crosses packages through it) is caught only by looking at the module graph as a
whole. grimp (import-linter's own graph builder) gives it, counting imports made only for type checking.
"""

from __future__ import annotations

import re
from pathlib import Path

import grimp

from tests.conftest import REPO

PACKAGES = ("common", "agent", "scheduler", "quotient")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    edges = {module: set(graph.find_modules_directly_imported_by(module)) for module in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found: list[list[str]] = []
    counter = 0
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in edges:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_two_modules_import_each_other_even_through_others_or_only_for_type_checking() -> None:
    graph = grimp.build_graph(*PACKAGES, include_external_packages=False, exclude_type_checking_imports=False)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle() -> None:
    graph = grimp.ImportGraph()
    for module in ("a", "a.x", "a.y", "a.z"):
        graph.add_module(module)
    graph.add_import(importer="a.x", imported="a.y")
    graph.add_import(importer="a.y", imported="a.z")
    graph.add_import(importer="a.z", imported="a.x")
    assert _cycles(graph) == [["a.x", "a.y", "a.z"]]


RAW_JSON = re.compile(r"""\.get\(\s*["'](metadata|spec|status)["']\s*\)|\[\s*["'](metadata|spec|status)["']\s*\]""")
"""Reading a Kubernetes object's JSON: ``obj.get("metadata")``, ``obj["spec"]``."""
EDGES = ("scheduler/kube/", "scheduler/objects/", "quotient/")
"""Where raw Kubernetes JSON may be read: the Kubernetes edge, the decoders it calls at the reflector, and the
local world (the emulator, the demo, the benchmarks, the reservation pod's entry point)."""


def test_raw_kubernetes_json_is_read_only_at_the_kubernetes_edge_and_in_the_decoders() -> None:
    readers = []
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*.py")):
            relative = path.relative_to(REPO).as_posix()
            if relative.startswith(EDGES):
                continue
            for number, line in enumerate(Path(path).read_text().splitlines(), start=1):
                if RAW_JSON.search(line):
                    readers.append(f"{relative}:{number}: {line.strip()}")
    assert readers == []
