"""Nested structures: how they are taken apart, rebuilt and walked, in one place.

Two kinds of nesting, each walked here and nowhere else:

- an observation or a batch: tuples (namedtuples keep their type), dicts (rebuilt as
  plain dicts), and, where asked, lists, around leaves. ``flatten`` takes one apart into
  its leaves and a ``TreeDef``; ``unflatten`` puts leaves back; ``map_across`` walks
  several of one structure together (the observations of a batch, a buffer and what
  goes into it). The protocol, collation, plans, the loader's buffers and the PyTorch
  integration all go through them.
- a container made of views: ``children`` are the members of a tuple or dict and the
  container under a view that keeps its indices (``mapobs``); the loader, streams and
  error messages find what lies under the views (``walk_views``, ``found_under``) and
  put other data there (``replaced``) with them.

The other recursions over tuples, dicts and lists in fastload follow rules of their own
at each level, so they are not these walks; each is listed here, and there is no other:

- ``collate`` (members collated only where the observations share a structure, else a
  list) and ``copy_into`` (a buffer's members checked against the value's, lists filled
  in place);
- the container protocol's ``numobs``, ``getobs`` and ``getobs_into`` of a tuple or a
  dict, which dispatch on each member (``members`` and ``rebuild`` from here);
- the drop-in's ``as_collated``, ``_pinned`` and ``fits_ring`` (PyTorch's rules: tuples
  made lists, objects with ``pin_memory()``, exact types);
- the binding's ``_collect`` (the tuples and dicts themselves, and the arrays' bases,
  for a slot's watch);
- ``subsets``' label keys (``_hashable``: lists and arrays made tuples) and the last
  member of a tuple through its ``obsview``s (``_last_member``), and
  ``_loading/schedule.py``'s ``folded_views``: both follow the ``obsview`` layers at the
  top of a container only, to fold their indices, not its members;
- ``tables``' conversions of Arrow and pandas columns, which walk those libraries' nested
  types, not Python's.

``LeafKind`` names how a leaf of an observation loads; plans choose it, and the binding
and the worker processes act on it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from .protocols import FedRows, FeedSource

__all__ = [
    "LEAF",
    "LeafKind",
    "TreeDef",
    "children",
    "fed_under",
    "flatten",
    "found_under",
    "head",
    "map_across",
    "map_tree",
    "members",
    "rebuild",
    "replaced",
    "row",
    "tree_leaves",
    "unflatten",
    "unwrap",
    "walk_views",
    "with_children",
]

_T = TypeVar("_T")


@dataclass(frozen=True)
class TreeDef:
    """The structure of a nested value without its leaves: ``kind`` is the type of the
    node (None for a leaf), ``keys`` its dict keys or tuple/list positions, ``subtrees``
    the structure of each member, and ``leaves`` how many leaves it holds."""

    kind: type | None
    keys: tuple[Any, ...] = ()
    subtrees: tuple[TreeDef, ...] = ()
    leaves: int = 1

    def paths(self) -> Iterator[tuple[Any, ...]]:
        """The keys leading to each leaf, in leaf order (``()`` for a leaf)."""
        if self.kind is None:
            yield ()
            return
        for key, sub in zip(self.keys, self.subtrees):
            for path in sub.paths():
                yield (key, *path)

    def nodes(self) -> Iterator[TreeDef]:
        """This node and every node under it (leaves included), depth first."""
        yield self
        for sub in self.subtrees:
            yield from sub.nodes()


LEAF = TreeDef(None)  # the structure of a value that is a leaf itself


class LeafKind(enum.Enum):
    """How one leaf of an observation fills its place in a slot."""

    GATHER = "gather"  # a numpy array: copied in C, without the GIL
    IMAGE = "image"  # images through the fused native pipeline, without the GIL
    INTO = "into"  # Python getobs_into into the slot's row, holding the GIL
    OBJECT = "object"  # Python getobs into a list, formed into the batch afterwards

    @property
    def native(self) -> bool:
        """Loaded in C without the GIL (else a Python callback fills it)."""
        return self is LeafKind.GATHER or self is LeafKind.IMAGE


def members(tree: tuple[Any, ...] | dict[Any, Any]) -> Iterable[tuple[Any, Any]]:
    """The (key, member) pairs of a tuple or dict."""
    return tree.items() if isinstance(tree, dict) else enumerate(tree)


def _is_node(value: Any, lists: bool) -> bool:
    return isinstance(value, (tuple, dict)) or (lists and isinstance(value, list))


def flatten(
    tree: Any, *, lists: bool = False, lower: Callable[[Any], Any] | None = None
) -> tuple[list[Any], TreeDef]:
    """(leaves, treedef) of nested tuples and dicts: the leaves in order (dicts in their
    keys' order) and the structure ``unflatten`` rebuilds. ``lists``: lists are structure
    too (a batch of lists of observations), else leaves (a container). ``lower``: each
    node is replaced by ``lower(node)`` before it is looked at (a table by the dict of its
    columns)."""
    leaves: list[Any] = []
    return leaves, _flatten_into(tree, leaves, lists, lower)


def _flatten_into(
    tree: Any, leaves: list[Any], lists: bool, lower: Callable[[Any], Any] | None
) -> TreeDef:
    if lower is not None:
        tree = lower(tree)
    if not _is_node(tree, lists):
        leaves.append(tree)
        return LEAF
    pairs = list(tree.items() if isinstance(tree, dict) else enumerate(tree))
    start = len(leaves)
    subtrees = tuple(_flatten_into(member, leaves, lists, lower) for _, member in pairs)
    keys = tuple(key for key, _ in pairs)
    return TreeDef(type(tree), keys, subtrees, len(leaves) - start)


def unflatten(treedef: TreeDef, leaves: Iterable[Any]) -> Any:
    """The structure ``treedef`` describes holding ``leaves`` in order: dicts as plain
    dicts, namedtuples of their type, other tuples as tuples, lists as lists. Raises
    ``ValueError`` when the count of leaves is not the structure's."""
    leaves = list(leaves)
    if len(leaves) != treedef.leaves:
        raise ValueError(f"a structure of {treedef.leaves} leaves cannot hold {len(leaves)}")
    return _build(treedef, iter(leaves))


def _build(treedef: TreeDef, leaves: Iterator[Any]) -> Any:
    kind = treedef.kind
    if kind is None:
        return next(leaves)
    return _node(kind, treedef.keys, [_build(sub, leaves) for sub in treedef.subtrees])


def _node(kind: type, keys: Sequence[Any], values: list[Any]) -> Any:
    """A node of type ``kind`` holding ``values`` (under ``keys`` for a dict)."""
    if issubclass(kind, dict):
        return dict(zip(keys, values))
    if issubclass(kind, list):
        return values
    return kind(*values) if hasattr(kind, "_fields") else tuple(values)


def rebuild(template: tuple[Any, ...] | dict[Any, Any], values: Iterable[Any]) -> Any:
    """A structure of the kind of ``template`` (a dict: its keys; a namedtuple: its type; a
    tuple) holding ``values`` as its members, in order."""
    keys = template.keys() if isinstance(template, dict) else ()
    return _node(type(template), list(keys), list(values))


def map_tree(f: Callable[[Any], Any], tree: Any, *, lists: bool = False) -> Any:
    """``f`` applied to every leaf of nested tuples and dicts (and lists, with ``lists``),
    in a tree of the same structure."""
    leaves, treedef = flatten(tree, lists=lists)
    return unflatten(treedef, [f(leaf) for leaf in leaves])


def map_across(f: Callable[[Sequence[Any]], Any], trees: Sequence[Any]) -> Any:
    """``f`` of the leaves at each place of ``trees`` (nested tuples and dicts, the
    others of the first's structure: its keys and positions are read from each), in a
    tree of the first's structure."""
    first = trees[0]
    if isinstance(first, dict):
        return {key: map_across(f, [t[key] for t in trees]) for key in first}
    if isinstance(first, tuple):
        return rebuild(first, [map_across(f, [t[j] for t in trees]) for j in range(len(first))])
    return f(trees)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of nested tuples and dicts, in order."""
    return flatten(tree)[0]


def head(buffer: Any, m: int) -> Any:
    """The first ``m`` rows of a batch buffer (an array, or a tuple/dict of them)."""
    return map_tree(lambda array: array[:m], buffer)


def row(buffer: Any, k: int) -> Any:
    """Row ``k`` of a batch buffer (an array, or a tuple/dict of them), as views: even for
    1-D arrays, where ``array[k]`` would be a copy."""
    # The common cases first, as map_tree makes them: a loader asks for every item's row.
    if not isinstance(buffer, (tuple, dict)):
        return buffer[k, ...]
    if type(buffer) is tuple and not any(isinstance(leaf, (tuple, dict)) for leaf in buffer):
        return tuple([leaf[k, ...] for leaf in buffer])
    return map_tree(lambda array: array[k, ...], buffer)


def _is_member_node(node: Any) -> bool:
    """A tuple or dict of containers; one that defines ``__numobs__`` is a container of its
    own (``numobs`` asks it first), not members."""
    return isinstance(node, (tuple, dict)) and not hasattr(node, "__numobs__")


def children(node: Any) -> list[Any]:
    """The containers right under ``node``: the members of a tuple or dict, or the one a
    view keeps the indices of (a view whose type sets ``keeps_indices``: observation ``i``
    of it is made from observation ``i`` of its ``data``, as in ``mapobs``); else none."""
    if _is_member_node(node):
        return [member for _, member in members(node)]
    if getattr(type(node), "keeps_indices", False):
        return [node.data]
    return []


def with_children(node: Any, new: Sequence[Any]) -> Any:
    """``node`` over the containers ``new`` instead of its ``children``: a tuple or dict
    of the same kind, or the same view (``node.over(data)``) of other data."""
    if _is_member_node(node):
        return rebuild(node, new)
    if getattr(type(node), "keeps_indices", False):
        return node.over(new[0])
    if new:
        raise ValueError(f"{type(node).__name__} has no containers under it to replace")
    return node


def walk_views(node: Any) -> Iterator[Any]:
    """``node`` and every container under it (``children``, recursively), depth first."""
    yield node
    for child in children(node):
        yield from walk_views(child)


def found_under(node: Any, offered: Callable[[Any], _T | None]) -> list[_T]:
    """What ``offered(node)`` gives (when not None), else what it gives for the containers
    under ``node`` (``children``, recursively), in order."""
    found = offered(node)
    if found is not None:
        return [found]
    return [v for child in children(node) for v in found_under(child, offered)]


def fed_under(node: Any) -> list[FeedSource]:
    """The ``row_feed`` of the containers under ``node`` that have one (``found_under``:
    whose rows are its rows), each once."""
    found: dict[int, FeedSource] = {}
    for source in found_under(node, lambda d: d.row_feed if isinstance(d, FedRows) else None):
        found.setdefault(id(source), source)
    return list(found.values())


def replaced(node: Any, old: Any, new: Any) -> Any:
    """``node`` with the container ``old`` (the object itself) replaced by ``new``, where
    it is ``node`` or under it (``children``, recursively)."""
    if node is old:
        return new
    return with_children(node, [replaced(child, old, new) for child in children(node)])


def unwrap(node: Any) -> Any:
    """The container under the views of ``node`` that keep its indices (itself when it is
    no such view): observation ``i`` of ``node`` comes from observation ``i`` of it."""
    while not _is_member_node(node) and getattr(type(node), "keeps_indices", False):
        node = node.data
    return node
