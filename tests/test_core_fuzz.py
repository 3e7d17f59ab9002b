"""No call of fastload._core, with any arguments, kills the interpreter: every public
function, class constructor and method is called with arguments of random shapes and types,
in child processes (tests/core_calls.py), and each call must return or raise a Python
exception; after each call the child writes over the arrays it gave and loads a few steps
of the iterations it made, so that what the binding kept of them is used after they
changed. A child that dies by a signal, exits abnormally or hangs fails the test, naming
the call that did it (run again alone in a fresh process to make sure).

Each example is a batch of calls run by one child. FASTLOAD_FUZZ_EXAMPLES sets how many
batches (default 12, about ten seconds); `make fuzz` runs many more.
"""

import ast
import inspect
import math
import os
import signal
from pathlib import Path

import core_calls
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import fastload
from fastload import _core

EXAMPLES = int(os.environ.get("FASTLOAD_FUZZ_EXAMPLES", "12"))
CALLS_PER_CHILD = 150
CHILD_TIMEOUT_S = 120  # a hang guard: a batch takes about a second

pytestmark = pytest.mark.fuzz

# Where a class's methods are called: expressions that make a ready object of it.
RECEIVERS = {
    "Pipeline": st.builds("pipeline({})".format, st.integers(0, 5)),
    "ImageSource": st.builds(
        "source({}, {!r})".format,
        st.integers(0, 5),
        st.sampled_from(["buffers", "spans", "offsets", "paths", "pixels"]),
    ),
    "Fields": st.builds("fields({!r})".format, st.sampled_from(["gather", "image", "python"])),
    "Iteration": st.builds(
        "iteration({}, {}, {!r})".format,
        st.integers(1, 5),
        st.integers(1, 3),
        st.sampled_from([None, "gather", "image", "python"]),
    ),
    "Stats": st.just("_core.Stats()"),
    "Progress": st.just("_core.Progress()"),
    "FileGuard": st.just("_core.FileGuard(bytes(range(16)))"),
    "SlotWatch": st.just("_core.SlotWatch([np.zeros(4)], (np.zeros(2),))"),
}


# Values, as expressions the child evaluates.
def _number(x):
    return repr(x) if math.isfinite(x) else f"float({str(x)!r})"


INTS = st.one_of(
    st.integers(-3, 40),
    st.sampled_from([2**31 - 1, -(2**31), 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
).map(repr)
FLOATS = st.one_of(
    st.floats(-2, 2), st.sampled_from([math.nan, math.inf, -math.inf, 1e300, -1e-300])
).map(_number)
NUMBERS = st.one_of(INTS, FLOATS, st.sampled_from(["None", "True", "False"]))
WORDS = st.sampled_from(
    [
        "''", "'center'", "'random'", "'random_resized'", "'shorter'", "'exact'", "'jitter'",
        "'grayscale'", "'blur'", "'gather'", "'image'", "'python'", "'fuzz'", "b''", "b'\\x00'",
    ]
)  # fmt: skip
SHAPES = st.lists(st.sampled_from([0, 1, 2, 3, 4, 5, 9]), max_size=4).map(tuple)
ARRAYS = st.builds(
    "arr({}, {!r}, {!r})".format,
    SHAPES,
    st.sampled_from(["uint8", "uint8", "float32", "int64", "float64", "bool", "uint16"]),
    st.sampled_from(["c", "c", "f", "strided", "reversed", "readonly", "scalar"]),
)
# A schedule's order or bounds: 1-D int64 arrays 0, 1, 2, ... (bounds of steps of one).
STEPS = st.builds(
    "arr(({},), 'int64', {!r})".format, st.integers(0, 12), st.sampled_from(["c", "readonly"])
)
IMAGES = st.builds(
    "arr({}, 'uint8', {!r})".format,
    st.lists(st.integers(0, 9), min_size=2, max_size=4).map(tuple),
    st.sampled_from(["c", "c", "f", "strided", "reversed", "readonly"]),
)
ENCODED = st.one_of(
    st.builds(
        "qoi({}, {}, {})".format, st.integers(1, 9), st.integers(1, 9), st.sampled_from([3, 4])
    ),
    st.builds("jpeg({}, {})".format, st.integers(1, 20), st.integers(1, 20)),
    st.builds("png({}, {})".format, st.integers(1, 9), st.integers(1, 9)),
    st.binary(max_size=24).map(repr),
).flatmap(
    lambda data: st.one_of(
        st.just(data),
        st.integers(0, 60).map(lambda n: f"cut({data}, {n})"),
        st.integers(0, 400).map(lambda at: f"flipped({data}, {at})"),
        st.just(f"bytearray({data})"),
        st.just(f"memoryview({data})"),
    )
)
OBJECTS = st.sampled_from(
    [
        "codecs", "object()", "(lambda *a, **k: None)", "Plan()", "_core.Stats()",
        "_core.Progress()", "pipeline(0)", "source(0)", "fields('gather')", "iteration()",
    ]
)  # fmt: skip
SCALARS = st.one_of(NUMBERS, WORDS)


def _sequence(elements, max_size=5, kinds=("({})", "[{}]")):
    return st.builds(
        lambda items, kind: kind.format(", ".join(items) + ("," if len(items) == 1 else "")),
        st.lists(elements, max_size=max_size),
        st.sampled_from(kinds),
    )


SPEC_KEYS = ["kind", "op", "ranges", "p", "kernel", "sigma", "scale", "ratio", "value"]
VALUES = st.deferred(
    lambda: st.one_of(
        SCALARS, ARRAYS, ENCODED, OBJECTS, _sequence(VALUES, 4), DICTS, _sequence(NUMBERS)
    )
)
DICTS = st.dictionaries(st.sampled_from(SPEC_KEYS), VALUES, max_size=6).map(
    lambda d: "{" + ", ".join(f"{k!r}: {v}" for k, v in d.items()) + "}"
)
PAIRS = _sequence(NUMBERS, 5)

# What a parameter of this name is given, most of the time: values near what it expects
# reach further into the code than any value at all.
HINTS = {
    **dict.fromkeys(["img", "decoded", "image", "x"], st.one_of(IMAGES, ARRAYS)),
    **dict.fromkeys(["batch", "out"], ARRAYS),
    "order": st.one_of(STEPS, ARRAYS),
    "bounds": st.one_of(STEPS, STEPS, ARRAYS, st.just("None")),
    **dict.fromkeys(["first_step", "end_step"], st.one_of(st.integers(0, 12).map(repr), INTS)),
    **dict.fromkeys(
        ["scale", "ratio", "crop_size", "resize_size", "box", "factors", "mean", "std"], PAIRS
    ),
    "data": ENCODED,
    "mapping": st.one_of(ENCODED, ARRAYS),
    "crop": st.sampled_from(["None", "'center'", "'random'", "'random_resized'", "'other'"]),
    "resize": st.sampled_from(["None", "'shorter'", "'exact'", "'other'"]),
    "pixel_ops": _sequence(DICTS, 3),
    "erasing": DICTS,
    "spans": _sequence(st.one_of(_sequence(ARRAYS, 3), ARRAYS, PAIRS, st.just("None")), 5),
    "offsets": _sequence(st.one_of(ARRAYS, PAIRS), 3),
    "buffers": _sequence(ENCODED, 3),
    "paths": _sequence(st.one_of(WORDS, st.just("'/nonexistent'")), 3),
    "pixels": _sequence(IMAGES, 3),
    "pipeline": RECEIVERS["Pipeline"],
    "decoder": st.just("codecs"),
    "name": st.just("'fuzz'"),
    "fields": st.one_of(
        RECEIVERS["Fields"],
        _sequence(
            _sequence(st.one_of(WORDS, ARRAYS, st.just("source(0)"), st.just("None")), 3),
            3,
            kinds=["[{}]"],
        ),
    ),
    "row_bytes": _sequence(INTS, 3, kinds=["[{}]"]),
    **dict.fromkeys(["ring", "values", "objects"], _sequence(VALUES, 3, kinds=["[{}]"])),
    **dict.fromkeys(
        ["p", "lam", "alpha", "a", "b", "sigma_y", "sigma_x", "flip_p"], st.one_of(FLOATS, INTS)
    ),
    "stats": st.just("_core.Stats()"),
    "progress": st.just("_core.Progress()"),
    "plan": st.just("Plan()"),
    **dict.fromkeys(
        ["filler", "on_end", "check", "transport"], st.sampled_from(["None", "(lambda *a: None)"])
    ),
}


def _stub_parameters():
    """Each class's constructor parameters, from fastload/_core.pyi (the compiled classes
    do not tell them): {class: ([positional], [keyword-only], {keyword-only without a
    default})}."""
    tree = ast.parse(Path(fastload.__file__).with_name("_core.pyi").read_text())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            out[node.name] = ([], [], set())
            for init in node.body:
                if isinstance(init, ast.FunctionDef) and init.name == "__init__":
                    args = init.args
                    out[node.name] = (
                        [a.arg for a in args.args[1:]],
                        [a.arg for a in args.kwonlyargs],
                        {a.arg for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None},
                    )
    return out


def _parameters(function):
    signature = inspect.signature(function)
    kinds = inspect.Parameter
    positional = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (kinds.POSITIONAL_ONLY, kinds.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    keyword = [p for p in signature.parameters.values() if p.kind == kinds.KEYWORD_ONLY]
    required = {p.name for p in keyword if p.default is inspect.Parameter.empty}
    return positional, [p.name for p in keyword], required


def entry_points():
    """(expression strategy of the callee, positional and keyword-only parameter names, the
    keyword-only ones without a default) of every public callable of the module:
    functions, constructors and methods."""
    constructors = _stub_parameters()
    found = []
    for name, value in sorted(vars(_core).items()):
        if name.startswith("_") or not callable(value):
            continue
        if not isinstance(value, type):
            found.append((name, st.just(f"_core.{name}"), *_parameters(value)))
            continue
        found.append((name, st.just(f"_core.{name}"), *constructors[name]))
        for method in sorted(vars(value)):
            attribute = getattr(value, method)
            if method == "__next__" or (not method.startswith("_") and callable(attribute)):
                receiver = RECEIVERS[name].map(f"{{}}.{method}".format)
                parameters = ([], [], set()) if method == "__next__" else _parameters(attribute)
                found.append((f"{name}.{method}", receiver, *parameters))
    return found


ENTRY_POINTS = entry_points()


def _argument(name, wild):
    """A value for parameter `name`: of the kind it expects (its hint, an int for the
    parameters without one), or, in a wild call, now and then anything at all."""
    hint = HINTS.get(name, INTS)
    return st.one_of(*[hint] * 4, NUMBERS, VALUES) if wild else hint


@st.composite
def calls(draw):
    """One call of one entry point as an expression: its positional parameters (in a wild
    call, some of them or one too many), its required keyword ones (in a wild call, some of
    them) and some others, each a value of a random shape and type."""
    _, callee, positional, keyword, required = draw(st.sampled_from(ENTRY_POINTS))
    wild = draw(st.booleans())
    count = len(positional)
    if wild:
        count = draw(st.sampled_from([count] * 3 + list(range(count + 2))))
    names = positional[:count] + ["extra"] * (count - len(positional))
    parts = [draw(_argument(n, wild)) for n in names]
    for name in keyword:
        if (name in required and not wild) or draw(st.booleans()):
            parts.append(f"{name}={draw(_argument(name, wild))}")
    return f"{draw(callee)}({', '.join(parts)})"


@st.composite
def runs(draw):
    """A run of a fresh iteration over a schedule of the shape a loader gives (an int64
    order, bounds of steps of one or None, steps about as many), with counts up to the
    int64 limit: a call C accepts more often than not, so that the child's aftermath loads
    from what the binding kept of arrays it then wrote over."""
    kind = draw(st.sampled_from(["gather", "image", "python"]))
    layout = st.sampled_from(["c", "readonly"])
    order = f"arr(({draw(st.integers(0, 12))},), 'int64', {draw(layout)!r})"
    bounds = draw(
        st.one_of(
            st.just("None"),
            st.builds("arr(({},), 'int64', {!r})".format, st.integers(1, 13), layout),
        )
    )
    options = {
        "first_step": draw(st.integers(0, 13)),
        "end_step": draw(st.integers(0, 13)),
        "seed": draw(st.integers(0, 2**64 - 1)),
        "epoch": draw(st.integers(0, 3)),
        "parallel": draw(st.one_of(st.integers(0, 3), st.just(2**31 - 1))),
        "claim_size": draw(st.one_of(st.integers(1, 4), st.sampled_from([2**62, 2**63 - 1]))),
        **{k: draw(st.booleans()) for k in ("ordered", "skip_errors", "release_gil")},
        "filler": draw(st.sampled_from(["None", "(lambda *a: None)"])),
    }
    receiver = f"iteration({draw(st.integers(1, 5))}, {draw(st.integers(1, 3))}, None, {kind!r})"
    arguments = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"{receiver}.start_run(fields({kind!r}), order={order}, bounds={bounds}, {arguments})"


def _fate(code):
    if code == "hung":
        return f"hangs (over {CHILD_TIMEOUT_S} s)"
    if code < 0:
        return f"dies by {signal.Signals(-code).name}"
    return f"exits with status {code}"


def check_calls(expressions):
    """Fails naming the call that killed (or hung) a child, alone if it does so alone,
    else with the calls before it."""
    code, last, output = core_calls.run(expressions, CHILD_TIMEOUT_S)
    if core_calls.completed(code, output):
        return
    if last is None:
        pytest.fail(f"the child {_fate(code)} before any call:\n{output[-3000:]}")
    alone, _, alone_output = core_calls.run([expressions[last]], CHILD_TIMEOUT_S)
    if not core_calls.completed(alone, alone_output):
        pytest.fail(
            f"the interpreter {_fate(alone)} in {expressions[last]}:\n{alone_output[-3000:]}"
        )
    batch = "\n".join(expressions[: last + 1])
    pytest.fail(f"the interpreter {_fate(code)} in the last of these calls:\n{batch}")


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # the failure names its call
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(
    st.lists(
        st.one_of(calls(), calls(), calls(), runs()),
        min_size=CALLS_PER_CHILD,
        max_size=CALLS_PER_CHILD,
    )
)
def test_no_call_of_the_core_with_any_arguments_kills_the_interpreter(expressions):
    check_calls(expressions)


def test_the_fuzz_target_calls_every_public_callable_of_the_core():
    called = {name for name, *_ in ENTRY_POINTS}
    for name, value in vars(_core).items():
        if not name.startswith("_") and callable(value):
            assert name in called
    assert {"Pipeline.run", "ImageSource.decode", "Iteration.start_run"} <= called
    public = {n for n, v in vars(_core).items() if isinstance(v, type) and not n.startswith("_")}
    assert set(RECEIVERS) == public
