"""No module of the repository imports itself back through others: no import cycle
anywhere, at any depth, counting imports inside functions (a lazy import is still a
dependency). The import-linter contracts keep the layering; this keeps every package,
the test bed's included, free of loops the contracts do not name.

The graph is grimp's (what import-linter reads), built from the source, nothing imported."""

from __future__ import annotations

import grimp

PACKAGES = ("llmtrain_operator", "llmtrain_trainer", "llmtrain_contract", "llmtrain_store", "localcluster")


def _cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Every strongly connected component of more than one module (Tarjan's algorithm),
    each sorted, plus every module that imports itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(start: str) -> None:
        nonlocal counter
        work = [(start, iter(sorted(graph.find_modules_directly_imported_by(start))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            module, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.find_modules_directly_imported_by(child)))))
                    break
                if child in on_stack:
                    low[module] = min(low[module], index[child])
            else:
                work.pop()
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[module])
                if low[module] == index[module]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == module:
                            break
                    if len(component) > 1 or module in graph.find_modules_directly_imported_by(module):
                        found.append(sorted(component))

    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return found


def test_no_module_of_the_repository_is_in_an_import_cycle():
    graph = grimp.build_graph(*PACKAGES, cache_dir=None)
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_a_cycle_through_several_modules_and_nothing_else():
    graph = grimp.ImportGraph()
    for module in ("a", "a.one", "a.two", "a.three", "a.four"):
        graph.add_module(module)
    graph.add_import(importer="a.one", imported="a.two")
    graph.add_import(importer="a.two", imported="a.three")
    graph.add_import(importer="a.three", imported="a.one")
    graph.add_import(importer="a.four", imported="a.one")
    assert _cycles(graph) == [["a.one", "a.three", "a.two"]]
