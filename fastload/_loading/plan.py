"""Plans: how the engine loads the steps of a container into slots.

A plan splits an observation into leaves (``tree.flatten``: the members of nested
tuples/dicts) and picks, per leaf, how to load one item into its place in a slot (a
``LeafKind``):

- ``GATHER``: a numpy array, copied natively without the GIL;
- ``IMAGE``: ``mapobs(Compose([...]), images)`` over images C can read (encoded bytes,
  files, packed columns, decoded arrays): the fused image pipeline, also without the GIL;
- ``INTO``: any other container whose observations are arrays: Python ``getobs_into``
  into the slot row, holding the GIL for that item;
- ``OBJECT``: observations that are not arrays, collected into a list, then formed into
  the batch by the schedule's ``Collate``.

Containers from other libraries are loaded as what they hold: a table as the dict of its
columns (``tables.columns``), a CPU tensor as its numpy view (its batches are made tensors
again), and a ``slidingwindow`` over arrays as its strided windows.

A plan is made from a container and a schedule (``schedule.py``); the order of the epoch
comes from the schedule, never from views. When a container defines its own batch
semantics the plan falls back to loading whole steps with ``getobs``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np
import numpy.typing as npt

from .. import tables, tensors
from .._base.collate import Collate
from .._base.tree import (
    LEAF,
    LeafKind,
    TreeDef,
    flatten,
    head,
    map_tree,
    row,
    tree_leaves,
    unflatten,
)
from .._images.imagesources import is_image_chain, native_images
from ..errors import LoadError, MisfitError
from ..obs import Container, exact_dtypes, getobs, getobs_into
from ..sparse import is_sparse
from ..views import MappedObs, SlidingWindow, collate_batch, source_of
from .schedule import Schedule
from .seams import Dests, Field, Objects

__all__ = ["ItemPlan", "MisfitError", "StepPlan", "make_plan"]

# ``allocator(shape, dtype)``: makes a slot's array (None: only counts its bytes).
_Allocator = Callable[[tuple[int, ...], np.dtype[Any]], Any]


def _custom_getobs(data: Any) -> bool:
    """True when ``data`` defines how several observations form a batch."""
    dispatch = getobs.dispatch  # type: ignore[attr-defined]  # set by obs.py's dispatcher
    return (
        hasattr(data, "__getobs__")
        or dispatch(type(data)) is not dispatch(object)
        or is_sparse(data)  # rows gathered by scipy into a sparse batch
    )


def _per_item(data: Any) -> bool:
    """True for ``mapobs`` with a function of one observation."""
    return isinstance(data, MappedObs) and not data.batched


class Spec:
    """Shape and dtype of one observation of a leaf; ``tensor``: it is a torch tensor."""

    __slots__ = ("dtype", "shape", "tensor")

    def __init__(self, shape: Sequence[int], dtype: npt.DTypeLike, tensor: bool = False) -> None:
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.tensor = tensor

    def __repr__(self) -> str:
        return f"Spec({self.shape}, {self.dtype}{', tensor' if self.tensor else ''})"


def _spec_of(value: Any) -> Any:
    """The Spec of an array-like observation (numbers, dates and times: strings are
    collected as objects), a tuple/dict of Specs, or None (also for an empty tuple/dict
    anywhere in it: nothing to make a slot of)."""
    leaves, treedef = flatten(value)
    if any(node.kind is not None and not node.keys for node in treedef.nodes()):
        return None
    specs = [_leaf_spec(leaf) for leaf in leaves]
    return None if any(spec is None for spec in specs) else unflatten(treedef, specs)


def _leaf_spec(value: Any) -> Spec | None:
    if tensors.is_tensor(value):
        view = tensors.numpy_view(value)
        return None if view is None else Spec(view.shape, view.dtype, tensor=True)
    if isinstance(value, (np.ndarray, np.generic, bool, int, float)):
        array = np.asarray(value)
        return Spec(array.shape, array.dtype) if array.dtype.kind in "biufcmM" else None
    return None


def _allocate(spec: Any, rows: int, allocator: _Allocator) -> Any:
    return map_tree(lambda leaf: allocator((rows,) + leaf.shape, leaf.dtype), spec)


def _has_tensors(spec: Any) -> bool:
    return any(leaf.tensor for leaf in tree_leaves(spec)) if spec is not None else False


def _scalar_leaves(spec: Any) -> bool:
    """True when an observation of ``spec`` has a numpy leaf of shape (): a number, which a
    single observation hands out as a numpy scalar (a value, not a view of the slot)."""
    return any(not leaf.tensor and not leaf.shape for leaf in tree_leaves(spec))


def _observation(value: Any, spec: Any) -> Any:
    """The single observation in row 0 of ``value`` (a slot's arrays, for ``spec``): views
    of the row, but a numpy scalar for each numpy leaf of shape (), as ``getobs`` of an
    array gives, so that it is the same value and type on every path and outlives the
    slot; a tensor's leaf stays a 0-d view (made a tensor of its own by ``_as_tensors``)."""
    values, treedef = flatten(value)
    marks = tree_leaves(spec)
    return unflatten(treedef, [v[0, ...] if s.tensor else v[0] for v, s in zip(values, marks)])


def _as_tensors(value: Any, spec: Any) -> Any:
    """``value`` (views of a slot) with the members ``spec`` marks as tensors made tensors
    that own their memory: the slot is reused after the step is handed out."""
    values, treedef = flatten(value)
    marks = tree_leaves(spec)
    return unflatten(
        treedef, [tensors.as_tensor(v) if s.tensor else v for v, s in zip(values, marks)]
    )


class Leaf:
    """One member of the observation and how it is loaded."""

    def __init__(
        self, container: Any, kind: LeafKind, spec: Any = None, source: Any = None
    ) -> None:
        self.container = container
        self.kind = kind  # a LeafKind
        self.spec = spec  # a Spec, or a tuple/dict of them for LeafKind.INTO
        self.source = source  # the _core.ImageSource of a LeafKind.IMAGE leaf

    def row_bytes(self) -> int:
        if not self.kind.native:
            return 0
        return int(np.prod(self.spec.shape, dtype=np.int64)) * int(self.spec.dtype.itemsize)

    def core_field(self) -> Field:
        """The binding's field: the kind, and what C reads (an array, an image source)."""
        if self.kind is LeafKind.GATHER:
            return (self.kind, self.container)
        if self.kind is LeafKind.IMAGE:
            return (self.kind, self.source)
        return (self.kind, None)


def _native_image_leaf(view: Any) -> Leaf | None:
    """A native Leaf for ``mapobs(Compose([...]), images)`` that C can load, or None."""
    images = native_images(view)
    if images is None:
        return None
    return Leaf(view, LeafKind.IMAGE, Spec(images.shape, images.dtype), images.source)


def _leaf(container: Any, stacks: bool) -> Leaf | None:
    """How to load ``container`` item by item, or None when only whole steps will do;
    ``stacks``: every observation goes into the step's arrays (single observations, or
    ``collate=True``), so even a container with batches of its own loads item by item."""
    if isinstance(container, Leaf):
        return container  # a table's column, whose kind its type decides
    if tensors.is_tensor(container) and container.dim() >= 1:
        view = tensors.numpy_view(container)
        if view is not None and not view.dtype.hasobject:
            return Leaf(view, LeafKind.GATHER, Spec(view.shape[1:], view.dtype, tensor=True))
    if isinstance(container, np.ndarray) and container.dtype.hasobject:
        return None  # references must be counted: Python loads whole steps
    if isinstance(container, np.ndarray) and container.ndim >= 1:
        return Leaf(container, LeafKind.GATHER, Spec(container.shape[1:], container.dtype))
    if _per_item(container):
        leaf = _native_image_leaf(container)
        if leaf is not None:
            return leaf
    if not stacks and _custom_getobs(container) and not _per_item(container):
        return None
    # Observations of one spec fill the slot's arrays; others are collected, then collated.
    try:
        spec = _spec_of(getobs(container, 0))
    except Exception:
        spec = None  # observation 0 fails: it fails again when loaded (or is skipped)
    if spec is None:
        return Leaf(container, LeafKind.OBJECT)
    return Leaf(container, LeafKind.INTO, spec)


def _lowered(data: Any) -> Any:
    """What the engine loads for ``data``: a table's columns, a slidingwindow's windows,
    else ``data`` itself."""
    if tables.is_table(data):
        return _table_members(tables.columns(data))
    if isinstance(data, SlidingWindow) and data.windows is not None:
        return data.windows
    return data


def _table_members(values: Any) -> Any:
    """A table's columns, those of Python values (strings, objects; None where missing)
    made object leaves: the column's type says that its values are no arrays, where its
    first value (None, or a number in a column of objects) would not."""
    return map_tree(
        lambda column: Leaf(column, LeafKind.OBJECT) if isinstance(column, list) else column,
        values,
    )


class ItemPlan:
    """Loads a step item by item into a slot of ``rows`` positions: the observations of a
    batch, or one observation when ``batch_size`` is None."""

    whole_steps: bool = False

    def __init__(
        self, layout: TreeDef, leaves: list[Leaf], batch_size: int | None, collate: Collate
    ) -> None:
        self.layout = layout
        self.leaves = leaves
        self.paths = ["".join(f"[{key!r}]" for key in path) for path in layout.paths()]
        self.batch_size = batch_size
        self.rows = batch_size or 1
        self.collate = collate  # the Collate that forms the object leaves of a batch
        self.tensors = [
            _has_tensors(leaf.spec) if leaf.kind is not LeafKind.OBJECT else False
            for leaf in leaves
        ]
        self.fields = [leaf.core_field() for leaf in leaves]
        self.row_bytes = [leaf.row_bytes() for leaf in leaves]
        self.has_python = any(not leaf.kind.native for leaf in leaves)
        self.has_objects = any(leaf.kind is LeafKind.OBJECT for leaf in leaves)
        # Single observations with numbers: each step's scalars are made from its slot.
        self.scalars = batch_size is None and any(
            leaf.kind is not LeafKind.OBJECT and _scalar_leaves(leaf.spec) for leaf in leaves
        )
        self.expensive = any(leaf.kind is not LeafKind.GATHER for leaf in leaves)
        self.signature = tuple((leaf.kind, repr(leaf.spec)) for leaf in leaves) + (batch_size,)

    def order(self, schedule: Schedule) -> npt.NDArray[np.int64]:
        """The indices the native run loads, ``rows`` a step."""
        return schedule.order

    def allocate(self, allocator: _Allocator = np.empty) -> Dests:
        """Fresh destinations for one slot: an array (or structure of arrays) per leaf,
        made by ``allocator(shape, dtype)``, None for leaves collected into lists."""
        return [
            _allocate(leaf.spec, self.rows, allocator) if leaf.kind is not LeafKind.OBJECT else None
            for leaf in self.leaves
        ]

    def new_objects(self) -> Objects:
        """The lists a slot's object leaves collect into (None for the other leaves)."""
        return [
            [None] * self.rows if leaf.kind is LeafKind.OBJECT else None for leaf in self.leaves
        ]

    def whole_value(self, dests: Dests) -> Any:
        """The value of a whole step in the slot ``dests`` (views of it), or None when it
        must be assembled per step (lists of objects, tensors, numpy scalars)."""
        if self.has_objects or self.scalars or any(self.tensors):
            return None
        return self.assemble(dests, None, self.rows)

    def fill(self, dests: Dests, objects: Objects, field: int, pos: int, index: int) -> None:
        """Load observation ``index`` of a Python leaf into position ``pos`` of a slot."""
        leaf = self.leaves[field]
        if leaf.kind is LeafKind.OBJECT:
            objects[field][pos] = getobs(leaf.container, index)
            return
        try:
            with exact_dtypes():
                getobs_into(row(dests[field], pos), leaf.container, index)
        except MisfitError as error:
            raise MisfitError(error.what, _misfit(error, leaf, self.paths[field])) from None

    def assemble(
        self,
        dests: Dests,
        objects: Objects | None,
        n: int,
        keep: npt.NDArray[np.bool_] | None = None,
    ) -> Any:
        """The step's value from its slot: views of the first ``n`` rows (or the single
        observation of row 0, numbers as numpy scalars), with rows where ``keep`` is False
        dropped; ``objects`` None for a plan without object leaves (``whole_value``)."""
        outputs = []
        for k, (leaf, dest) in enumerate(zip(self.leaves, dests)):
            if leaf.kind is LeafKind.OBJECT:
                assert objects is not None, "a plan with object leaves assembles their lists"
                value = objects[k][:n]
                if keep is not None:
                    value = [v for v, kept in zip(value, keep) if kept]
                value = value[0] if self.batch_size is None else self.collate.form(value)
            else:
                value = head(dest, n)
                if keep is not None:
                    value = map_tree(lambda array: array[np.asarray(keep, bool)], value)
                if self.batch_size is None:
                    value = _observation(value, leaf.spec)
                if self.tensors[k]:
                    value = _as_tensors(value, leaf.spec)
            outputs.append(value)
        return unflatten(self.layout, outputs)

    def load_error(
        self, step: int, field: int | None, index: int, message: str, cause: BaseException | None
    ) -> Exception:
        """The exception for observation ``index`` that failed in ``field`` (None: unknown)."""
        if isinstance(cause, LoadError):
            return cause
        source = None if field is None else source_of(self.leaves[field].container, index)
        where = f" ({source})" if source and source not in message else ""
        error = LoadError(
            f"could not load observation {index}{where}: {message}", index=index, source=source
        )
        error.__cause__ = cause
        return error


def _misfit(error: MisfitError, leaf: Leaf, path: str) -> str:
    """The message for an observation of ``leaf`` that does not fit the slot made for
    observation 0 (``error`` says how), in the words of the data at hand."""
    where = f" (member {path} of the observations)" if path else ""
    head = (
        f"{error}{where}: the batch buffers take the shape and dtype of observation 0 "
        f"({_describe(leaf.spec)})"
    )
    if error.what == "dtype":
        return (
            f"{head}, and a batch holds what np.stack of its observations gives: a cast "
            "could lose information, and np.stack would promote to another dtype. Give "
            "every observation one dtype: a table's column with astype, any container with "
            "a cast in mapobs, e.g. mapobs(lambda x: np.asarray(x, np.float64), data)"
        )
    hint = (
        " (for images, a crop after Resize, e.g. CenterCrop)"
        if is_image_chain(leaf.container)
        else ""
    )
    return (
        f"{head}, and one batch holds one shape: make every observation that shape{hint}, "
        "or use collate=False to get lists"
    )


def _describe(spec: Any) -> str:
    """A Spec (or a tuple/dict of them) in words: "shape (2, 3) of float32"."""
    if isinstance(spec, Spec):
        return f"shape {spec.shape} of {spec.dtype}"
    return repr(map_tree(lambda leaf: f"{leaf.dtype}{list(leaf.shape)}", spec))


class StepPlan:
    """Loads each step whole with ``getobs`` (one native item per step): the fallback for
    containers that define their own batches. With ``skip``, a step that fails is loaded
    again observation by observation, without the ones that fail; ``stats`` counts them."""

    whole_steps: bool = True
    has_python: bool = True
    has_objects: bool = True
    expensive: bool = True
    rows: int = 1
    signature: tuple[Any, ...] = ("step",)

    def __init__(
        self, data: Container, schedule: Schedule, skip: bool = False, stats: Any = None
    ) -> None:
        # One field, an object list of one row: the step's value. Each plan has its own
        # lists, which the binding and the ring read.
        self.fields: list[Field] = [(LeafKind.OBJECT, None)]
        self.row_bytes: list[int] = [0]
        self.data = data
        self.schedule = schedule
        self.batch_size = schedule.batch_size
        self.skip = skip
        self.stats = stats

    def order(self, schedule: Schedule) -> npt.NDArray[np.int64]:
        return np.arange(schedule.steps, dtype=np.int64)

    def allocate(self, allocator: _Allocator = np.empty) -> Dests:
        return [None]

    def new_objects(self) -> Objects:
        return [[None]]

    def whole_value(self, dests: Dests) -> Any:
        return None

    def fill(self, dests: Dests, objects: Objects, field: int, pos: int, step: int) -> None:
        positions = self.schedule.positions(step)
        try:
            objects[0][0] = self._load(positions)
        except Exception:
            if not self.skip:
                raise
            kept = [int(j) for j in positions if _loads(self.data, int(j))]
            self.stats.skipped += len(positions) - len(kept)
            if not kept:
                raise
            objects[0][0] = self._load(np.asarray(kept, np.int64))

    def _load(self, positions: npt.NDArray[np.int64]) -> Any:
        if self.schedule.batch_size is None:
            return getobs(self.data, int(positions[0]))
        return collate_batch(self.data, positions, self.schedule.collate)

    def assemble(
        self, dests: Dests, objects: Objects, n: int, keep: npt.NDArray[np.bool_] | None = None
    ) -> Any:
        return objects[0][0]

    def load_error(
        self, step: int, field: int | None, index: int, message: str, cause: BaseException | None
    ) -> Exception:
        if isinstance(cause, LoadError):
            return cause
        error = LoadError(f"could not load step {step}: {message}")
        error.__cause__ = cause
        return error


def _loads(data: Any, j: int) -> bool:
    try:
        getobs(data, j)
        return True
    except Exception:
        return False


def make_plan(
    data: Container, schedule: Schedule, *, skip: bool = False, stats: Any = None
) -> ItemPlan | StepPlan:
    """The plan for loading the steps of ``schedule`` from the container ``data``. Batches
    with ``collate`` None or True, and single observations, load item by item into slots;
    containers with batch semantics of their own load whole steps (``StepPlan``)."""
    batch_size, collate = schedule.batch_size, schedule.collate
    if len(schedule.order) == 0:
        return StepPlan(data, schedule, skip, stats)
    if batch_size is not None and collate.whole:
        return ItemPlan(LEAF, [Leaf(data, LeafKind.OBJECT)], batch_size, collate)
    stacks = batch_size is None or collate.stacks
    members, layout = flatten(data, lower=_lowered)
    leaves = [_leaf(member, stacks) for member in members]
    if any(leaf is None for leaf in leaves):
        return StepPlan(data, schedule, skip, stats)
    return ItemPlan(layout, cast(list[Leaf], leaves), batch_size, collate)
