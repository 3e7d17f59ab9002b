"""The import graph of ``fastload/``: each layer imports its own layer and the layers below
it, the few arrows that run back up are named with their reason, and no module reaches
itself through its imports (docs/architecture.md, "Layers", draws the graph).

Every import is an arrow, wherever it is written: at the top of a module, inside a function
(a lazy import is still an arrow), under ``TYPE_CHECKING``, and the Python imports of the
binding (``_core.pyx`` and the ``.pxi`` files it includes; ``cimport`` lines are C). A node
is a module, named from ``fastload/`` down (``_loading.plan``, ``storage.reader``);
``__init__`` is the package itself, and ``_core`` the binding's sources as one.
"""

import ast
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "fastload"

# Bottom to top; the entries are ``fnmatch`` patterns, and a module of a private package
# is in its package's layer.
LAYERS = [
    # Modules that import nothing of fastload: errors, limits, the thread's (seed, epoch),
    # and the libraries recognised as containers without being imported.
    ("leaves", ["errors", "limits", "context", "tensors", "sparse", "tables"]),
    # The shared helpers: storage protocols, nested structures, collation, randomness,
    # option checks, refused keywords, the process toolkit, the version.
    ("base", ["_base", "_base.*"]),
    ("core", ["_core", "_jpeg"]),
    # Image codecs, mixes and sources; the packed format's encodings, checks, maps, remote
    # reads and encoders.
    ("machinery", ["_images", "_images.*", "_storage", "_storage.*"]),
    # The user's vocabulary: containers, views, subsets, orders, samplers, streams, transforms,
    # mixes.
    (
        "vocabulary",
        [
            "obs",
            "views",
            "subsets",
            "samplers",
            "order",
            "streams",
            "transforms",
            "imagefolder",
            "layouts",
            "joined",
            "mixtures",
        ],
    ),
    # The engine: schedules, epochs, plans, transports; and what fastload.torch runs on.
    ("engine", ["_loading", "_loading.*"]),
    ("loader", ["loader"]),
    ("storage", ["storage", "storage.*"]),
    ("integrations", ["torch", "jax", "demo", "cluster", "cluster.*"]),
    ("front", ["__init__", "__main__"]),
]

# (importer, imported): why this arrow runs back up. Each one is named here; a new one
# fails the test until it is added with its reason, and one that went away must leave.
BACK_ARROWS = {
    ("_images.imagesources", "views"): "a native image source is made for a mapobs view "
    "(MappedObs): its function and its container",
    ("_storage.encoders", "obs"): "the writer's encoders read each row with getobs",
    ("_storage.encoders", "views"): "a row that fails to encode is named by its file, "
    "which source_of finds under the views",
}

_PYX_IMPORT = re.compile(r"^\s*(?:from\s+(\.*[\w.]*)\s+import\s+([\w, ]+)|import\s+([\w.]+))")


def module_files(package=PACKAGE):
    """{node: its source files} for every module of ``package`` and the binding."""
    nodes = {}
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package).with_suffix("").parts
        if parts[-1] == "__init__" and len(parts) > 1:
            parts = parts[:-1]
        nodes[".".join(parts)] = [path]
    for pyx in sorted(package.glob("*.pyx")):
        includes = re.findall(r'^include\s+"([\w.]+)"', pyx.read_text(), re.MULTILINE)
        nodes[pyx.stem] = [pyx] + [package / name for name in includes]
    return nodes


def resolve(name, nodes):
    """The node that the dotted ``name`` (``fastload.`` and down) is or lies in."""
    parts = name.split(".")[1:]
    while parts and ".".join(parts) not in nodes:
        parts.pop()
    return ".".join(parts) or "__init__"


def imported(source, where, nodes, cython=False):
    """The nodes that ``source`` imports, wherever the imports are written; ``where`` is the
    package the module lies in (``["_loading"]``, ``[]`` for the top), for relative ones."""
    found = set()

    def add(level, module, names=()):
        if level:
            package = ["fastload", *where[: len(where) - level + 1]]
            module = ".".join(package + ([module] if module else []))
        if module == "fastload" or module.startswith("fastload."):
            # `from package import module` imports the module; `from module import name`, it
            found.update(resolve(f"{module}.{name}", nodes) for name in names or [""])

    if cython:
        for line in source.splitlines():
            match = _PYX_IMPORT.match(line)
            if match and "cimport" not in line:
                module, names, plain = match.groups()
                if plain:
                    add(0, plain)
                else:
                    level = len(module) - len(module.lstrip("."))
                    add(level, module.lstrip("."), [n.split()[0] for n in names.split(",")])
    else:
        for stmt in ast.walk(ast.parse(source)):
            if isinstance(stmt, ast.Import):
                for alias in stmt.names:
                    add(0, alias.name)
            elif isinstance(stmt, ast.ImportFrom):
                add(stmt.level, stmt.module, [alias.name for alias in stmt.names])
    return found


def import_graph(package=PACKAGE):
    """{node: the other nodes it imports} over every module of ``package``."""
    nodes = module_files(package)
    graph = {}
    for node, paths in nodes.items():
        parts = [] if node == "__init__" else node.split(".")
        where = parts if paths[0].name == "__init__.py" else parts[:-1]
        cython = paths[0].suffix == ".pyx"
        graph[node] = set().union(*(imported(p.read_text(), where, nodes, cython) for p in paths))
        graph[node].discard(node)
    return graph


def layer_of(node, layers=LAYERS):
    """The index in ``layers`` of the one layer that names ``node``."""
    found = {k for k, (_, entries) in enumerate(layers) for e in entries if fnmatch(node, e)}
    assert len(found) == 1, f"{node} is in {len(found)} layers: name it in one of LAYERS"
    return found.pop()


def back_arrows(graph, layers=LAYERS):
    """The arrows (importer, imported) that run from a layer to one above it."""
    return {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if layer_of(b, layers) > layer_of(a, layers)
    }


def reached(graph, start):
    """Every node ``start`` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for b in graph[todo.pop()] - seen:
            seen.add(b)
            todo.append(b)
    return seen


def cycles(graph):
    """The groups of nodes that reach each other (strongly connected, more than one)."""
    reach = {a: reached(graph, a) for a in graph}
    groups = {frozenset(b for b in reach[a] if a in reach[b]) for a in graph if a in reach[a]}
    return sorted(sorted(group) for group in groups)


GRAPH = import_graph()


def test_the_reader_finds_every_import_top_level_lazy_relative_and_in_the_binding():
    nodes = {"__init__": [], "obs": [], "views": [], "_base": [], "_base.tree": []}
    source = (
        "import numpy\nfrom . import obs\nfrom ._base.tree import flatten\n"
        "def f():\n    from fastload.views import mapobs\n"
    )
    assert imported(source, [], nodes) == {"obs", "_base.tree", "views"}
    assert imported("from .. import obs\nfrom .tree import x\n", ["_base"], nodes) == {
        "obs",
        "_base.tree",
    }
    pxi = "from libc.stdint cimport int64_t\nfrom ._base import tree as _tree  # C\nimport os\n"
    assert imported(pxi, [], nodes, cython=True) == {"_base.tree"}
    assert "_base.tree" in GRAPH["_core"] and "errors" in GRAPH["_core"]


def test_every_module_has_a_layer_and_every_layer_entry_names_a_module():
    for node in GRAPH:
        layer_of(node)
    for name, entries in LAYERS:
        for entry in entries:
            assert any(fnmatch(node, entry) for node in GRAPH), f"{name}: {entry} names nothing"


def test_at_most_eight_arrows_run_back_up_and_each_is_named_with_its_reason():
    assert len(BACK_ARROWS) <= 8
    assert back_arrows(GRAPH) == set(BACK_ARROWS)
    assert all(reason.strip() for reason in BACK_ARROWS.values())


def test_no_module_reaches_itself_through_its_imports():
    assert cycles(GRAPH) == []


def test_nothing_in_the_base_reaches_the_engine_or_anything_above_the_base():
    base = [node for node in GRAPH if fnmatch(node, "_base*")]
    for node in base:
        assert not {b for b in reached(GRAPH, node) if b.startswith("_loading")}, node
        assert all(layer_of(b) <= layer_of(node) for b in reached(GRAPH, node)), node


def test_the_binding_imports_only_the_base_and_the_leaves():
    below = {k for k, (name, _) in enumerate(LAYERS) if name in ("leaves", "base")}
    assert {layer_of(b) for b in reached(GRAPH, "_core")} <= below


@pytest.mark.parametrize("module", ["transforms", "_images.codecs", "limits", "_core"])
def test_the_planner_imports_no_image_code(module):
    # plan.py plans leaves; the image sources (and transforms, codecs, limits) live apart.
    assert module not in GRAPH["_loading.plan"]


def test_the_planner_reaches_no_transforms():
    assert "transforms" not in reached(GRAPH, "_loading.plan")


def test_the_engine_imports_no_storage_module():
    # Storage meets the engine at its seams (seams.Feed, _base.protocols.FeedSource): what a
    # dataset at a URL needs is fed through them, never wired into the engine.
    for node in GRAPH:
        if fnmatch(node, "_loading*"):
            assert not {b for b in GRAPH[node] if b.startswith("_storage")}, node
