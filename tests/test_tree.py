"""Nested structures (fastload._base.tree): one flatten/unflatten for observations and batches,
one traversal of the containers under views."""

import ast
from collections import OrderedDict, namedtuple
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import fastload
from fastload import getobs, mapobs, obsview
from fastload._base import tree
from fastload._base.tree import (
    LEAF,
    TreeDef,
    children,
    flatten,
    found_under,
    map_across,
    map_tree,
    replaced,
    row,
    tree_leaves,
    unflatten,
    unwrap,
    walk_views,
    with_children,
)
from fastload.views import source_of

Pair = namedtuple("Pair", "x y")


def _same(a, b):
    """Equal values of the same types all the way down (namedtuples stay namedtuples)."""
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _same(a[key], b[key])
    elif isinstance(a, (tuple, list)):
        assert len(a) == len(b)
        for u, v in zip(a, b):
            _same(u, v)
    else:
        assert a == b


_trees = st.recursive(
    st.integers(),
    lambda sub: st.one_of(
        st.lists(sub, max_size=3).map(tuple),
        st.lists(sub, max_size=3),
        st.builds(Pair, sub, sub),
        st.dictionaries(st.text(max_size=3), sub, max_size=3),
    ),
    max_leaves=12,
)


@given(_trees)
def test_unflatten_of_flatten_gives_the_tree_back_with_its_types(tree):
    leaves, treedef = flatten(tree, lists=True)
    assert all(isinstance(leaf, int) for leaf in leaves)
    assert treedef.leaves == len(leaves)
    _same(unflatten(treedef, leaves), tree)


@given(_trees)
def test_without_lists_a_list_is_one_leaf(tree):
    leaves, treedef = flatten(tree)
    assert not any(isinstance(leaf, (tuple, dict)) for leaf in leaves)
    _same(unflatten(treedef, leaves), tree)


def test_a_nested_observation_flattens_in_key_order_and_keeps_its_paths():
    obs = (np.zeros(2), {"image": np.ones(3), "label": Pair(1, 2)})
    leaves, treedef = flatten(obs)
    assert [type(leaf).__name__ for leaf in leaves] == ["ndarray", "ndarray", "int", "int"]
    assert list(treedef.paths()) == [(0,), (1, "image"), (1, "label", 0), (1, "label", 1)]
    rebuilt = unflatten(treedef, ["a", "b", "c", "d"])
    assert rebuilt == ("a", {"image": "b", "label": Pair("c", "d")})
    assert type(rebuilt[1]["label"]) is Pair


def test_a_leaf_only_observation_is_one_leaf_and_comes_back_as_itself():
    x = np.arange(3)
    leaves, treedef = flatten(x)
    assert treedef == LEAF and leaves[0] is x
    assert unflatten(treedef, leaves) is x
    assert list(treedef.paths()) == [()]


def test_dict_subclasses_come_back_as_dicts_and_tuple_subclasses_as_tuples():
    class Tagged(tuple):
        pass

    leaves, treedef = flatten((OrderedDict(a=1), Tagged((2, 3))))
    assert unflatten(treedef, leaves) == ({"a": 1}, (2, 3))
    assert type(unflatten(treedef, leaves)[0]) is dict
    assert type(unflatten(treedef, leaves)[1]) is tuple


def test_empty_members_are_nodes_without_leaves():
    leaves, treedef = flatten((1, (), {}))
    assert leaves == [1]
    assert [node.leaves for node in treedef.subtrees] == [1, 0, 0]
    assert unflatten(treedef, [5]) == (5, (), {})


def test_unflatten_refuses_another_count_of_leaves():
    _, treedef = flatten((1, 2))
    with pytest.raises(ValueError, match="2 leaves cannot hold 3"):
        unflatten(treedef, [1, 2, 3])


def test_lower_replaces_each_node_before_it_is_looked_at():
    class Table:
        def __init__(self, columns):
            self.columns = columns

    def lower(node):
        return node.columns if isinstance(node, Table) else node

    leaves, treedef = flatten((Table({"a": 1, "b": (2, 3)}), 4), lower=lower)
    assert leaves == [1, 2, 3, 4]
    assert unflatten(treedef, leaves) == ({"a": 1, "b": (2, 3)}, 4)


def test_map_tree_goes_through_lists_only_when_asked():
    tree = {"a": [1, 2], "b": (3,)}
    assert map_tree(lambda x: x * 10, tree, lists=True) == {"a": [10, 20], "b": (30,)}
    lists_whole = map_tree(lambda x: len(x) if isinstance(x, list) else x * 10, tree)
    assert lists_whole == {"a": 2, "b": (30,)}


def test_map_across_gives_f_the_leaves_at_each_place_in_the_first_trees_structure():
    trees = [Pair(1, {"a": 2, "b": [3]}), (10, {"b": [30], "a": 20})]
    out = map_across(
        lambda leaves: sum(len(x) if isinstance(x, list) else x for x in leaves), trees
    )
    assert out == Pair(11, {"a": 22, "b": 2}) and type(out) is Pair
    assert map_across(list, [1, 2, 3]) == [1, 2, 3]  # leaves all: f of them all


def test_row_is_row_k_of_every_leaf_as_a_view_in_the_buffers_structure():
    a, b = np.arange(12).reshape(4, 3), np.arange(4.0)
    for buffer in (a, b, (a, b), Pair(a, b), {"x": a, "y": b}, (a, (b, {"z": a}))):
        got = row(buffer, 2)
        assert type(got) is type(buffer)
        assert flatten(got)[1] == flatten(buffer)[1]
        for leaf, array in zip(tree_leaves(got), tree_leaves(buffer)):
            assert leaf.shape == array.shape[1:] and np.shares_memory(leaf, array)
            assert np.array_equal(leaf, array[2])


def test_treedef_is_a_value():
    assert flatten((1, {"a": 2}))[1] == flatten((5, {"a": 6}))[1]
    assert flatten((1, {"a": 2}))[1] != flatten((1, {"b": 2}))[1]
    assert isinstance(hash(flatten(Pair(1, 2))[1]), int)
    assert TreeDef(None) == LEAF


# The containers under views.


def test_children_are_the_members_of_tuples_and_dicts_and_the_data_under_mapobs():
    a, b = np.arange(4), np.arange(4) * 2
    inner = (a, {"b": b})
    view = mapobs(lambda x: x, inner)
    assert children(view) == [inner]
    assert children(inner)[0] is a and children(inner)[1] == {"b": b}
    assert children(a) == []
    assert [type(node).__name__ for node in walk_views(view)] == [
        "MappedObs",
        "tuple",
        "ndarray",
        "dict",
        "ndarray",
    ]


def test_views_that_change_the_indices_have_no_children():
    # obsview's observation i is another observation of its data: walking into it would
    # name the wrong file or stream position.
    view = obsview(np.arange(5), [4, 3])
    assert children(view) == []
    assert unwrap(view) is view


def test_a_tuple_that_defines_numobs_is_a_container_of_its_own():
    class Pairs(tuple):
        def __numobs__(self):
            return 2

    pairs = Pairs((np.arange(2), np.arange(2)))
    assert children(pairs) == []
    assert list(walk_views((pairs, 1))) == [(pairs, 1), pairs, 1]


def test_unwrap_goes_down_through_mapobs_to_the_container():
    data = np.arange(3)
    assert unwrap(mapobs(str, mapobs(abs, data))) is data
    assert unwrap(data) is data


def test_with_children_rebuilds_views_over_other_data():
    view = mapobs(lambda x: x[0] + x[1]["k"], (np.arange(3), {"k": np.arange(3)}))
    other = (np.arange(3) * 10, {"k": np.arange(3) * 100})
    moved = with_children(view, [other])
    assert moved is not view and moved.f is view.f and moved.data is other
    assert getobs(moved, 2) == 220 and getobs(view, 2) == 4
    assert with_children((1, 2), [3, 4]) == (3, 4)
    assert with_children({"a": 1}, [2]) == {"a": 2}
    with pytest.raises(ValueError, match="no containers under it"):
        with_children(np.arange(2), [1])


def test_found_under_stops_where_offered_finds_something():
    a, b = np.arange(4), np.arange(4) * 2
    data = mapobs(lambda x: x, (a, {"b": b, "c": (a, b)}))
    arrays = found_under(data, lambda node: node if isinstance(node, np.ndarray) else None)
    assert [x is a for x in arrays] == [True, False, True, False]
    nested = mapobs(lambda x: x, {"outer": {"inner": a}})
    dicts = found_under(nested, lambda node: list(node) if isinstance(node, dict) else None)
    assert dicts == [["outer"]]  # not the dict under it
    assert found_under(obsview(data, [1]), lambda node: None) == []


def test_replaced_puts_new_data_where_the_old_container_was():
    a, new = np.arange(3), np.arange(3) * 10
    view = mapobs(lambda x: x[0] + x[1]["k"], (a, {"k": a}))
    moved = replaced(view, a, new)
    assert getobs(moved, 2) == 40 and getobs(view, 2) == 4
    assert replaced(a, a, new) is new
    assert replaced((np.arange(3), 1), a, new)[1] == 1


def test_source_of_names_the_file_under_mapobs():
    class Files:
        paths = ["a.jpg", "b.jpg"]

        def __len__(self):
            return 2

        def __getitem__(self, i):
            return self.paths[i]

    assert source_of(mapobs(str.upper, mapobs(str, Files())), 1) == "b.jpg"
    assert source_of(np.arange(2), 1) is None


# The functions outside _base/tree.py that call themselves on the members of tuples, dicts
# or lists: the ones its docstring lists, each following rules of its own.
LISTED_RECURSIONS = {
    "_base/collate.py:collate",
    "obs.py:copy_into",
    "_loading/torch_batches.py:as_collated",
    "_loading/torch_batches.py:_pinned",
    "_loading/torch_ring.py:fits_ring",
    "subsets.py:_hashable",
    "subsets.py:_last_member",
    "views.py:_strided_windows",  # through map_tree
}


def _callee(func):
    """The name a call calls itself by: ``f(...)``, ``self.f(...)`` or ``cls.f(...)``."""
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute) and getattr(func.value, "id", None) in ("self", "cls"):
        return func.attr
    return None


def _recursions_over_structures(root):
    """``path:function`` of each function under ``root`` that calls itself and tests a
    value for a tuple, a dict or a list."""
    found = set()
    for path in sorted(root.rglob("*.py")):
        if path.name == "tree.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            called = {_callee(call.func) for call in ast.walk(node) if isinstance(call, ast.Call)}
            tested = {
                name.id
                for call in ast.walk(node)
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "isinstance"
                for name in ast.walk(call.args[1])
                if isinstance(name, ast.Name)
            }
            if node.name in called and tested & {"tuple", "dict", "list"}:
                found.add(f"{path.relative_to(root).as_posix()}:{node.name}")
    return found


def test_the_tree_is_the_only_walker_of_structures_but_the_recursions_it_lists():
    root = Path(fastload.__file__).resolve().parent
    assert _recursions_over_structures(root) == LISTED_RECURSIONS
    doc = tree.__doc__
    for entry in LISTED_RECURSIONS - {"views.py:_strided_windows"}:
        assert entry.split(":")[1] in doc, entry
