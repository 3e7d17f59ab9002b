"""fastload/_core.pyi describes the compiled module: the same public names, and the
signatures of the functions it types."""

import ast
import inspect
from pathlib import Path

import fastload
from fastload import _core

STUB = Path(fastload.__file__).with_name("_core.pyi")


def stub_names():
    tree = ast.parse(STUB.read_text())
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    constants = {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    return functions, classes, constants


def test_the_stub_names_every_public_name_of_the_module_and_no_other():
    functions, classes, constants = stub_names()
    public = {
        name
        for name, value in vars(_core).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == set(functions) | set(classes) | constants


def test_the_stub_gives_each_function_the_parameters_of_the_compiled_one():
    functions, classes, _ = stub_names()
    for name, node in functions.items():
        compiled = inspect.signature(getattr(_core, name))
        stubbed = [a.arg for a in node.args.args + node.args.kwonlyargs]
        assert list(compiled.parameters) == stubbed, name
    for cls, node in classes.items():
        for method in (n for n in node.body if isinstance(n, ast.FunctionDef)):
            if method.decorator_list:  # a read-only attribute
                assert not callable(getattr(getattr(_core, cls), method.name)), method.name
                continue
            if method.name.startswith("__"):
                continue
            compiled = inspect.signature(getattr(getattr(_core, cls), method.name))
            stubbed = [a.arg for a in method.args.args + method.args.kwonlyargs]
            assert list(compiled.parameters) == stubbed, f"{cls}.{method.name}"


def test_the_libjpeg_module_stub_names_its_functions_where_it_is_built():
    stub = ast.parse(STUB.with_name("_jpeg.pyi").read_text())
    stubbed = {n.name for n in stub.body if isinstance(n, ast.FunctionDef)}
    try:
        from fastload import _jpeg
    except ImportError:  # built without libjpeg: the core says so
        assert _core.jpeg_library_version() == 0 and _core.JPEG_FALLBACK_REASON
        return
    public = {
        name
        for name, value in vars(_jpeg).items()
        if not name.startswith("_") and not inspect.ismodule(value)
    }
    assert public == stubbed
    assert _core.jpeg_library_version() == _jpeg.library_version() > 0
