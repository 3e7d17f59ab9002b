"""Nested observations: tuples (namedtuples keep their type), dicts, and leaves.

The one place that knows how a structure is taken apart and rebuilt; the protocol, views,
collation, plans and streams all go through it.
"""
__all__ = ["head", "map_tree", "members", "rebuild", "row", "tree_leaves"]


def members(tree):
    """The (key, member) pairs of a tuple or dict."""
    return tree.items() if isinstance(tree, dict) else enumerate(tree)


def rebuild(template, values):
    """A structure of the kind of ``template`` (a dict: its keys; a namedtuple: its type; a
    tuple) holding ``values`` in order."""
    if isinstance(template, dict):
        return dict(zip(template.keys(), values))
    values = list(values)
    return type(template)(*values) if hasattr(template, "_fields") else tuple(values)


def map_tree(f, tree):
    """``f`` applied to every leaf of nested tuples and dicts, in a tree of the same
    structure."""
    if isinstance(tree, (tuple, dict)):
        return rebuild(tree, [map_tree(f, member) for _, member in members(tree)])
    return f(tree)


def tree_leaves(tree):
    """The leaves of nested tuples and dicts, in order."""
    if isinstance(tree, (tuple, dict)):
        return [leaf for _, member in members(tree) for leaf in tree_leaves(member)]
    return [tree]


def head(buffer, m):
    """The first ``m`` rows of a batch buffer (an array, or a tuple/dict of them)."""
    return map_tree(lambda array: array[:m], buffer)


def row(buffer, k):
    """Row ``k`` of a batch buffer (an array, or a tuple/dict of them), as views: even for
    1-D arrays, where ``array[k]`` would be a copy."""
    return map_tree(lambda array: array[k, ...], buffer)
