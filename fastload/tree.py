"""Nested observations: tuples (namedtuples keep their type), dicts, and leaves.

How a structure is taken apart into its leaves and rebuilt around new ones, for the
protocol, views, collation, plans and streams.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["head", "map_tree", "members", "rebuild", "row", "tree_leaves"]


def members(tree: tuple[Any, ...] | dict[Any, Any]) -> Iterable[tuple[Any, Any]]:
    """The (key, member) pairs of a tuple or dict."""
    return tree.items() if isinstance(tree, dict) else enumerate(tree)


def rebuild(template: tuple[Any, ...] | dict[Any, Any], values: Iterable[Any]) -> Any:
    """A structure of the kind of ``template`` (a dict: its keys; a namedtuple: its type; a
    tuple) holding ``values`` in order."""
    if isinstance(template, dict):
        return dict(zip(template.keys(), values))
    values = list(values)
    return type(template)(*values) if hasattr(template, "_fields") else tuple(values)


def map_tree(f: Callable[[Any], Any], tree: Any) -> Any:
    """``f`` applied to every leaf of nested tuples and dicts, in a tree of the same
    structure."""
    if isinstance(tree, (tuple, dict)):
        return rebuild(tree, [map_tree(f, member) for _, member in members(tree)])
    return f(tree)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of nested tuples and dicts, in order."""
    if isinstance(tree, (tuple, dict)):
        return [leaf for _, member in members(tree) for leaf in tree_leaves(member)]
    return [tree]


def head(buffer: Any, m: int) -> Any:
    """The first ``m`` rows of a batch buffer (an array, or a tuple/dict of them)."""
    return map_tree(lambda array: array[:m], buffer)


def row(buffer: Any, k: int) -> Any:
    """Row ``k`` of a batch buffer (an array, or a tuple/dict of them), as views: even for
    1-D arrays, where ``array[k]`` would be a copy."""
    return map_tree(lambda array: array[k, ...], buffer)
