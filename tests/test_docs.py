"""Every ``python`` code block in ``docs/`` runs, so the guides cannot drift from the code.

Each Markdown page's ```` ```python ```` blocks are executed in order, in one namespace, in a
fresh Python subprocess on CPU whose working directory is a temporary directory. A block whose
info string carries ``title="not run: <reason>"`` is shown on the site but skipped here; use
it only for code that cannot run on a CPU-only machine without network (a GPU cluster, a Hub
download), and give the reason. Blocks in other languages (``bash``, ``text``, ``yaml``) are
not executed.

Failures name the page and the Markdown line: the harness pads each block with blank lines so
the traceback's line numbers are the page's own.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
#: The info-string marker of a block that is displayed but not executed.
NOT_RUN = 'title="not run'
#: Seconds one page may take (tiny shapes; generous because CI machines are shared).
PAGE_TIMEOUT = 300

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced ``python`` block: its page, the Markdown line of its first code line, the
    fence's info string after the language, and the dedented code."""

    page: str
    line: int
    info: str
    code: str

    @property
    def runnable(self) -> bool:
        return NOT_RUN not in self.info


def extract_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks whose language is ``python`` (or ``py``), in page order.

    Fences may be indented (inside admonitions or list items); the closing fence must use the
    same character and at least as many of them. An unclosed fence raises ``ValueError``.
    """
    lines = text.splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        fence, indent = opening["fence"], opening["indent"]
        info = opening["info"].strip()
        language, _, rest = info.partition(" ")
        body: list[str] = []
        j = i + 1
        while j < len(lines):
            closing = _FENCE.match(lines[j])
            if (
                closing is not None
                and closing["fence"][0] == fence[0]
                and len(closing["fence"]) >= len(fence)
                and not closing["info"].strip()
            ):
                break
            body.append(lines[j])
            j += 1
        else:
            raise ValueError(f"{page}:{i + 1}: fence {fence!r} is never closed")
        if language.lower().lstrip("{.") in ("python", "py"):
            code = textwrap.dedent(
                "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in body)
            )
            blocks.append(Block(page, i + 2, rest.strip(), code))
        i = j + 1
    return blocks


def pages() -> list[Path]:
    """Every Markdown page under ``docs/`` that has at least one runnable python block."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        blocks = extract_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
        if any(block.runnable for block in blocks):
            found.append(path)
    return found


# Runs in the subprocess: reads the blocks as JSON on stdin, executes them in one namespace.
_DRIVER = """
import json, sys, traceback
blocks = json.load(sys.stdin)
namespace = {"__name__": "__main__"}
for block in blocks:
    source = "\\n" * (block["line"] - 1) + block["code"]
    print(f"--- running {block['page']}:{block['line']}", flush=True)
    try:
        exec(compile(source, block["page"], "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"FAILED: block at {block['page']}:{block['line']}", file=sys.stderr, flush=True)
        sys.exit(1)
print("ALL BLOCKS PASSED", flush=True)
"""


def run_blocks(blocks: list[Block], workdir: Path) -> subprocess.CompletedProcess[str]:
    """Execute the runnable blocks in order in one fresh interpreter, in ``workdir``."""
    # The default JAX configuration a reader has: CPU, one device, no flags another test set.
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "XLA_FLAGS" and not key.startswith("JAX_")
    }
    env["JAX_PLATFORMS"] = "cpu"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH", "")]))
    payload = json.dumps([block.__dict__ for block in blocks if block.runnable])
    return subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=payload,
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        timeout=PAGE_TIMEOUT,
    )


def _page_id(path: Path) -> str:
    return str(path.relative_to(DOCS))


@pytest.mark.parametrize("page", pages(), ids=_page_id)
def test_page_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = extract_blocks(page.read_text(encoding="utf-8"), str(page.relative_to(ROOT)))
    result = run_blocks(blocks, tmp_path)
    assert result.returncode == 0, f"{page}:\n{result.stdout[-4000:]}\n{result.stderr[-8000:]}"
    assert "ALL BLOCKS PASSED" in result.stdout


def test_every_block_compiles() -> None:
    """Every python block on every page, runnable or not, is valid Python."""
    for path in sorted(DOCS.rglob("*.md")):
        for block in extract_blocks(path.read_text(encoding="utf-8"), str(path)):
            compile(block.code, f"{block.page}:{block.line}", "exec")


def test_not_run_blocks_are_rare_and_explained() -> None:
    """Skipped blocks say why after the marker, and stay a small minority of all blocks."""
    blocks = [
        block
        for path in sorted(DOCS.rglob("*.md"))
        for block in extract_blocks(path.read_text(encoding="utf-8"), str(path))
    ]
    skipped = [block for block in blocks if not block.runnable]
    for block in skipped:
        reason = block.info.split(NOT_RUN, 1)[1].split('"', 1)[0].lstrip(":").strip()
        assert reason, f"{block.page}:{block.line}: a not-run block must give its reason"
    assert len(skipped) * 5 <= len(blocks), f"too many not-run blocks: {len(skipped)}/{len(blocks)}"


# --- tests of the harness itself -------------------------------------------------------------

_SAMPLE = """# A page

Text.

```python
x = 2
```

```bash
exit 1
```

!!! note
    ```python
    y = x * 3
    ```

```python title="not run: needs a cluster"
raise SystemExit("never executed")
```

````python
z = "```"
````
"""


def test_extract_finds_python_blocks_with_lines_and_markers() -> None:
    blocks = extract_blocks(_SAMPLE, "sample.md")
    assert [(b.line, b.code, b.runnable) for b in blocks] == [
        (6, "x = 2", True),
        (15, "y = x * 3", True),
        (19, 'raise SystemExit("never executed")', False),
        (23, 'z = "```"', True),
    ]


def test_extract_rejects_an_unclosed_fence() -> None:
    with pytest.raises(ValueError, match="sample.md:1: fence"):
        extract_blocks("```python\nx = 1\n", "sample.md")


def test_blocks_share_one_namespace_and_skip_not_run(tmp_path: Path) -> None:
    blocks = extract_blocks(_SAMPLE + '\n```python\nassert y == 6 and z == "```"\n```\n', "s.md")
    result = run_blocks(blocks, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ALL BLOCKS PASSED" in result.stdout


def test_a_block_with_a_syntax_error_fails_and_names_its_line(tmp_path: Path) -> None:
    page = "# Broken\n\n```python\nx = 1\n```\n\n```python\ndef f(:\n    pass\n```\n"
    blocks = extract_blocks(page, "broken.md")
    with pytest.raises(SyntaxError):
        compile(blocks[1].code, "broken.md", "exec")
    result = run_blocks(blocks, tmp_path)
    assert result.returncode != 0
    assert "SyntaxError" in result.stderr
    assert 'File "broken.md", line 8' in result.stderr
    assert "FAILED: block at broken.md:8" in result.stderr


def test_a_block_that_raises_fails_and_later_blocks_do_not_run(tmp_path: Path) -> None:
    page = (
        "```python\nopen('first', 'w').close()\n```\n\n"
        "```python\nraise RuntimeError('boom')\n```\n\n"
        "```python\nopen('third', 'w').close()\n```\n"
    )
    result = run_blocks(extract_blocks(page, "raises.md"), tmp_path)
    assert result.returncode != 0
    assert "RuntimeError: boom" in result.stderr
    assert (tmp_path / "first").exists() and not (tmp_path / "third").exists()
