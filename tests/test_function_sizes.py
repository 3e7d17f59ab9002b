"""No function of the package (``fastload/``: Python, ``.pyx``, ``.pxi``) or of the C core
(``csrc/*.c``) is longer than 80 lines, from its ``def`` or the first line of its C
signature to its last line (decorators aside).

Python is measured on its syntax tree; ``.pyx``/``.pxi`` by indentation (a ``def``,
``cpdef`` or ``cdef`` function ends before the next line that is indented no deeper); C
by matching the braces of each top-level body, with comments, string literals and
preprocessor lines blanked out first.
"""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LIMIT = 80


def python_lengths(source):
    """{qualified name: lines} of every function in Python ``source``; a nested
    function or a method is named through what holds it (``Engine.iterate``)."""
    lengths = {}

    def visit(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = prefix + child.name
                if not isinstance(child, ast.ClassDef):
                    lines = child.end_lineno - child.lineno + 1
                    lengths[name] = max(lines, lengths.get(name, 0))  # the longest of a name
                visit(child, name + ".")
            else:
                visit(child, prefix)

    visit(ast.parse(source), "")
    return lengths


# A def, cpdef or cdef function's first line: no "=" before its "(" (which a cdef variable
# set from a call has) and not "cdef class"/"cdef extern".
_CYTHON_DEF = re.compile(
    r"^(\s*)(?:async\s+def|def|cpdef|cdef)\s+(?!class\b|extern\b)[^=(]*?(\w+)\s*\("
)


def cython_lengths(source):
    """{qualified name: lines} of every function in Cython ``source``, by indentation."""
    lines = source.splitlines()
    lengths = {}
    holders = []  # (indent, name) of the classes and functions around the line
    for k, line in enumerate(lines):
        body = line.strip()
        if not body or body.startswith("#"):
            continue
        indent = len(line) - len(line.lstrip())
        while holders and holders[-1][0] >= indent:
            holders.pop()
        cls = re.match(r"\s*cdef\s+class\s+(\w+)|\s*class\s+(\w+)", line)
        match = _CYTHON_DEF.match(line)
        if cls:
            holders.append((indent, cls.group(1) or cls.group(2)))
        elif match:
            name = ".".join([h for _, h in holders] + [match.group(2)])
            lengths[name] = _indented_block_end(lines, k, indent) - k + 1
            holders.append((indent, match.group(2)))
    return lengths


def _indented_block_end(lines, first, indent):
    """The index of the last code line of the function whose signature starts at
    ``lines[first]``: its signature (brackets may carry it over several lines) and the code
    lines after it up to the next one indented ``indent`` or less."""
    k, depth = first, 0
    while True:  # to the end of the signature
        depth += sum(lines[k].count(c) for c in "([{") - sum(lines[k].count(c) for c in ")]}")
        if depth <= 0 and lines[k].rstrip().endswith(":"):
            break
        k += 1
    end = k
    for j in range(k + 1, len(lines)):
        body = lines[j].strip()
        if not body or body.startswith("#"):
            continue
        if len(lines[j]) - len(lines[j].lstrip()) <= indent:
            break
        end = j
    return end


def _blank_c_noise(source):
    """``source`` with its comments, string and character literals and preprocessor lines
    replaced by spaces, newlines kept (so braces in them do not count, lines stay put)."""
    noise = re.compile(
        r"/\*.*?\*/|//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'|^[ \t]*#(?:\\\n|[^\n])*",
        re.S | re.M,
    )
    return noise.sub(lambda m: re.sub(r"[^\n]", " ", m.group()), source)


def c_lengths(source):
    """{name: lines} of every function defined in C ``source``: from the first line of its
    signature to its closing brace."""
    text = _blank_c_noise(source)
    lengths = {}
    depth, header_start, body_start = 0, 0, None
    for k, c in enumerate(text):
        if c == "{":
            if depth == 0:
                body_start = k
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                header = text[header_start:body_start]
                signature = re.search(r"(\w+)\s*\([^;=]*\)\s*$", header)
                if signature and "=" not in header.split("(")[0]:
                    first = header_start + len(header) - len(header.lstrip())
                    lines = text.count("\n", first, k) + 1
                    lengths[signature.group(1)] = lines
                header_start = k + 1
        elif c == ";" and depth == 0:
            header_start = k + 1
    return lengths


def package_lengths():
    """{(file, function): lines} of every function in fastload/ and csrc/."""
    lengths = {}
    files = (
        sorted((ROOT / "fastload").rglob("*.py"), key=str)
        + sorted((ROOT / "fastload").rglob("*.pyx"), key=str)
        + sorted((ROOT / "fastload").rglob("*.pxi"), key=str)
        + sorted((ROOT / "csrc").glob("*.c"), key=str)
    )
    for path in files:
        source = path.read_text(encoding="utf-8")
        measure = {".py": python_lengths, ".c": c_lengths}.get(path.suffix, cython_lengths)
        for name, lines in measure(source).items():
            key = (path.relative_to(ROOT).as_posix(), name)
            lengths[key] = max(lines, lengths.get(key, 0))
    return lengths


def test_no_function_in_the_package_or_the_c_core_is_over_80_lines():
    lengths = package_lengths()
    over = sorted(
        f"{file}: {name} ({lines} lines)"
        for (file, name), lines in lengths.items()
        if lines > LIMIT
    )
    assert not over, f"functions over {LIMIT} lines; split them:\n" + "\n".join(over)


def test_the_scan_finds_the_functions_of_every_kind_of_file():
    lengths = package_lengths()
    kinds = {Path(file).suffix for file, _ in lengths}
    assert kinds == {".py", ".pyx", ".pxi", ".c"}
    assert ("csrc/qoi.c", "fl_qoi_encode") in lengths
    assert ("fastload/storage/writer.py", "write") in lengths
    assert ("fastload/_engine.pxi", "Fields._gather") in lengths


def test_python_lengths_count_from_def_to_last_line_through_classes():
    source = (
        "@decorator\ndef f():\n    x = 1\n\n    return x\n\n"
        "class C:\n    def g(self):\n        pass\n"
    )
    assert python_lengths(source) == {"f": 4, "C.g": 2}


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def f(a,\n      b):\n    x = a\n\n    # a comment\n    return x\n\nx = 1\n", {"f": 6}),
        ("cdef int f(int a) noexcept nogil:\n    return a\ncdef int x = g(1)\n", {"f": 2}),
        ("cdef class C:\n    cdef int n\n    def g(self):\n        pass\n\n    def h(self):\n"
         "        return 1\n", {"C.g": 2, "C.h": 2}),
        ("def f():\n    pass\n# trailing\n", {"f": 2}),
    ],
)  # fmt: skip
def test_cython_lengths_count_by_indentation(source, expected):
    assert cython_lengths(source) == expected


def test_c_lengths_match_braces_and_skip_what_is_not_a_function():
    source = (
        "/* } a comment { */\n"
        "#define BODY(x) do { x; } while (0)\n"
        "typedef struct {\n    int a;\n} pair;\n"
        'static const char *s = "{";\n'
        "static const int table[2] = {1, 2};\n"
        "static int f(int a,\n             int b) {\n"
        "    if (a) {\n        return '}';\n    }\n    return b;\n}\n"
        "int g(void) { return 0; }\n"
    )
    assert c_lengths(source) == {"f": 7, "g": 1}
