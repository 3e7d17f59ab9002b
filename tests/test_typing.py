"""The public API is typed: every parameter annotated, the annotations resolve at run
time (no broken strings), the package says it is typed (py.typed), and mypy checks a
user's code against them: what the library accepts passes, what it refuses is flagged."""

import importlib.resources
import inspect
import typing
from pathlib import Path

import pytest
from helpers import mypy_on

import fastload
import fastload.storage
import fastload.transforms
from fastload import DataLoader

ROOT = Path(fastload.__file__).resolve().parent.parent


def _typed_callable(obj):
    """The function whose annotations say how ``obj`` is called: a class's own
    ``__init__`` (None when it has none), else ``obj``."""
    if inspect.isclass(obj):
        return obj.__dict__.get("__init__")
    return obj


def _constructors(*modules):
    """The functions and the classes with an ``__init__`` of their own in the modules'
    ``__all__``."""
    objects = [getattr(module, name) for module in modules for name in module.__all__]
    return [obj for obj in objects if callable(obj) and _typed_callable(obj) is not None]


def _missing_annotations(f):
    """The parameters of ``f`` without an annotation (``self`` aside), and "return"."""
    signature = inspect.signature(f)
    missing = [
        name
        for name, p in signature.parameters.items()
        if name not in ("self", "cls") and p.annotation is inspect.Parameter.empty
    ]
    if signature.return_annotation is inspect.Signature.empty:
        missing.append("return")
    return missing


def test_dataloader_annotates_every_argument():
    signature = inspect.signature(DataLoader.__init__)
    assert list(signature.parameters)[:3] == ["self", "data", "batch_size"]
    assert _missing_annotations(DataLoader.__init__) == []
    hints = typing.get_type_hints(DataLoader.__init__)
    assert set(hints) == set(signature.parameters) - {"self"} | {"return"}
    assert hints["batch_size"] is int
    assert typing.get_args(hints["on_error"]) == ("raise", "skip")


@pytest.mark.parametrize(
    "name",
    [
        "__iter__",
        "__len__",
        "__enter__",
        "__exit__",
        "close",
        "order",
        "schedule",
        "stats",
        "state_dict",
        "load_state_dict",
    ],
)
def test_dataloader_methods_are_annotated(name):
    method = getattr(DataLoader, name)
    assert _missing_annotations(method) == []
    typing.get_type_hints(method)


def test_the_allocator_property_is_annotated():
    assert _missing_annotations(DataLoader.allocator.fget) == []
    assert _missing_annotations(DataLoader.allocator.fset) == []
    assert "return" in typing.get_type_hints(DataLoader.allocator.fget)


@pytest.mark.parametrize("obj", _constructors(fastload), ids=lambda obj: obj.__name__)
def test_every_public_name_has_complete_annotations_that_resolve(obj):
    f = _typed_callable(obj)
    assert _missing_annotations(f) == []
    hints = typing.get_type_hints(f)
    assert set(inspect.signature(f).parameters) - {"self"} <= set(hints)


@pytest.mark.parametrize(
    "obj", _constructors(fastload.transforms, fastload.storage), ids=lambda obj: obj.__name__
)
def test_transform_and_encoding_constructors_annotate_their_arguments(obj):
    f = _typed_callable(obj)
    names = set(inspect.signature(f).parameters) - {"self"}
    assert names <= set(typing.get_type_hints(f))


def test_the_package_is_marked_typed():
    assert importlib.resources.files("fastload").joinpath("py.typed").is_file()
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in pyproject["tool"]["setuptools"]["package-data"]["fastload"]


# A user's code: each line marked "# error" must be flagged, nothing else.
USER_CODE = """\
import numpy as np
from fastload import DataLoader, batchview, eachobs, numobs, splitobs
from fastload.transforms import Compose, Normalize, RandomResizedCrop

data = (np.zeros((10, 3), np.float32), np.arange(10))
loader = DataLoader(data, 4, shuffle=True, parallel=2, shard=(0, 1), on_error="skip")
reveal_type(len(loader))
reveal_type(loader.state_dict())
reveal_type(numobs(data))
train, test = splitobs(data, at=0.8)
for batch in DataLoader(train, 2, collate=lambda observations: observations):
    pass
images = Compose([RandomResizedCrop(8), Normalize(0.5, 0.5)])(np.zeros((9, 9, 3), np.uint8))
reveal_type(images)
DataLoader(data, 4, num_workers=2)  # error
DataLoader(data, 4, shuffle="yes")  # error
eachobs(data, backend="processes")  # error
batchview(data, "4")  # error
"""


@pytest.mark.slow
def test_mypy_accepts_typical_use_and_flags_the_mistakes(tmp_path):
    pytest.importorskip("mypy.api")
    out, flagged, expected = mypy_on(USER_CODE, tmp_path)
    assert flagged == expected, out
    revealed = [
        line.split("Revealed type is ")[1].replace("builtins.", "")
        for line in out.splitlines()
        if "Revealed type is" in line
    ]
    assert revealed[:3] == ['"int"', '"dict[str, Any]"', '"int"'], out
    assert revealed[3].startswith('"numpy.ndarray['), out
