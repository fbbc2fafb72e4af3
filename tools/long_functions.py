"""List the long functions and methods under ``packages/*/src``, longest first.

A function's length here is the line span of its body without the docstring: from the first
statement after the docstring to the end of the last one, so a short body under a long
docstring does not count as long. Nested functions are measured on their own as well as
inside the function that holds them.

    python tools/long_functions.py          # every body over 60 lines
    python tools/long_functions.py -n 40    # every body over 40 lines

Each line of output is ``BODY_LINES  path:line  qualified.name``. ``tests/test_function_length.py``
loads this file and holds the source tree to a limit.
"""

from __future__ import annotations

import argparse
import ast
import pathlib
from collections.abc import Iterator
from typing import NamedTuple

ROOT = pathlib.Path(__file__).resolve().parents[1]


class LongFunction(NamedTuple):
    """One function: where it is defined, its qualified name and its body length in lines."""

    path: str
    line: int
    name: str
    body_lines: int


def body_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines from the first statement after the docstring to the end of the last statement."""
    body = node.body
    if (
        len(body) > 1
        and isinstance(body[0], ast.Expr)
        and isinstance(body[0].value, ast.Constant)
        and isinstance(body[0].value.value, str)
    ):
        body = body[1:]
    end = body[-1].end_lineno
    assert end is not None
    return end - body[0].lineno + 1


def functions(source: str, path: str = "<string>") -> Iterator[LongFunction]:
    """Every function and method in ``source`` with its qualified name and body length."""

    def walk(node: ast.AST, prefix: str) -> Iterator[LongFunction]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                yield LongFunction(path, child.lineno, name, body_lines(child))
                yield from walk(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(ast.parse(source), "")


def long_functions(limit: int, root: pathlib.Path = ROOT) -> list[LongFunction]:
    """Functions under ``root/packages/*/src`` whose body is over ``limit`` lines, longest first."""
    found = [
        function
        for path in sorted(root.glob("packages/*/src/**/*.py"))
        for function in functions(path.read_text(), str(path.relative_to(root)))
        if function.body_lines > limit
    ]
    return sorted(found, key=lambda function: (-function.body_lines, function.path, function.line))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "-n", "--limit", type=int, default=60, help="report bodies over this many lines"
    )
    args = parser.parse_args()
    for function in long_functions(args.limit):
        print(f"{function.body_lines:5d}  {function.path}:{function.line}  {function.name}")


if __name__ == "__main__":
    main()
