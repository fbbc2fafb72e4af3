"""No function under ``packages/*/src`` has a body (docstring left out) over ``LIMIT`` lines.

A function that long is usually coordinating several steps; it is broken into named steps, each
a private function with one purpose, rather than left to grow. The scan is
``tools/long_functions.py`` (loaded from its file: the tools are scripts, not a package); the
planted sources below show it finds a long function, so the check cannot pass on an empty scan.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
PATH = ROOT / "tools" / "long_functions.py"
LIMIT = 80


def _tool():
    spec = importlib.util.spec_from_file_location("dew_long_functions_tool", PATH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


tool = _tool()


def _function(name: str, body: int, docstring: int = 0) -> str:
    lines = [f"def {name}():"]
    if docstring:
        lines += ['    """'] + ["    text"] * docstring + ['    """']
    lines += [f"    x{i} = {i}" for i in range(body)]
    return "\n".join(lines) + "\n"


def test_no_function_body_is_over_the_limit() -> None:
    long = tool.long_functions(LIMIT, ROOT)
    found = [f"{f.path}:{f.line} {f.name} ({f.body_lines} lines)" for f in long]
    assert not found, f"bodies over {LIMIT} lines; break them into named steps: {found}"


def test_the_scan_reads_every_source_package() -> None:
    packages = {path.parent.name for path in ROOT.glob("packages/*/src")}
    scanned = {f.path.split("/")[1] for f in tool.long_functions(0, ROOT)}
    assert len(packages) == 5 and scanned == packages, (packages, scanned)


def test_a_planted_long_function_is_found() -> None:
    source = _function("short", 3) + _function("long", LIMIT + 1)
    found = {f.name: f.body_lines for f in tool.functions(source)}
    assert found == {"short": 3, "long": LIMIT + 1}


def test_the_docstring_does_not_count() -> None:
    found = {f.name: f.body_lines for f in tool.functions(_function("documented", 5, 100))}
    assert found == {"documented": 5}


def test_methods_and_nested_functions_are_measured_by_qualified_name() -> None:
    inner = "\n".join("        " + line for line in _function("inner", LIMIT + 1).splitlines())
    source = f"class Outer:\n    def method(self):\n{inner}\n        return inner\n"
    found = {f.name: f.body_lines for f in tool.functions(source)}
    assert found["Outer.method.inner"] == LIMIT + 1
    assert found["Outer.method"] == LIMIT + 3
