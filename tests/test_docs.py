"""Every ``python`` code block in ``docs/`` runs, so the guides cannot drift from the code.

Each Markdown page's ```` ```python ```` blocks are executed in order, in one namespace of
their own, with a temporary working directory of their own. All pages run one after another
in a single fresh Python subprocess on CPU with JAX's default settings and cheaper XLA
compilation (one interpreter, so JAX is imported once, not once a page); a failing block stops
its page, not the others. A block whose info string carries ``title="not run: <reason>"`` is
shown on the site but skipped here; use it only for code that cannot run on a CPU-only machine
without network (a container engine, a GPU cluster, a Hub download), and give the reason.
Blocks in other languages (``bash``, ``text``, ``yaml``) are not executed; keep the guides'
code in ``python`` blocks.

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
#: XLA flags for the docs run: cheaper compilation, same results (see ``run_pages``).
FAST_COMPILE_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"
#: Seconds all pages together may take (tiny shapes; generous because CI machines are shared).
RUN_TIMEOUT = 900

_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>[^\n]*)$")


@dataclass(frozen=True)
class Block:
    """One fenced block: its page, the Markdown line of its first code line, its language, the
    rest of the fence's info string, and the dedented code."""

    page: str
    line: int
    language: str
    info: str
    code: str

    @property
    def is_python(self) -> bool:
        return self.language in ("python", "py")

    @property
    def runnable(self) -> bool:
        return self.is_python and NOT_RUN not in self.info


def fenced_blocks(text: str, page: str) -> list[Block]:
    """Every fenced code block of a Markdown page, in page order, whatever its language.

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
        language, _, rest = opening["info"].strip().partition(" ")
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
        code = textwrap.dedent(
            "\n".join(line[len(indent) :] if line.startswith(indent) else line for line in body)
        )
        blocks.append(Block(page, i + 2, language.lower().lstrip("{."), rest.strip(), code))
        i = j + 1
    return blocks


def extract_blocks(text: str, page: str) -> list[Block]:
    """The fenced blocks whose language is ``python`` (or ``py``), in page order."""
    return [block for block in fenced_blocks(text, page) if block.is_python]


def pages() -> list[Path]:
    """Every Markdown page under ``docs/`` that has at least one runnable python block."""
    found = []
    for path in sorted(DOCS.rglob("*.md")):
        blocks = extract_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
        if any(block.runnable for block in blocks):
            found.append(path)
    return found


# Runs in the subprocess. Reads ``[pages, results_path]`` as JSON on stdin; each page is a
# ``{"page", "workdir", "blocks"}`` entry. Every page gets a fresh namespace and its own working
# directory; its blocks run in order until one raises. The results file is rewritten after each
# page, so a run that dies part way still reports the pages it finished.
_DRIVER = """
import json, os, sys, time, traceback
pages, results_path = json.load(sys.stdin)
results = {}
for entry in pages:
    page = entry["page"]
    os.chdir(entry["workdir"])
    namespace = {"__name__": "__main__"}
    result = {"ok": True, "line": None, "error": "", "seconds": 0.0}
    started = time.perf_counter()
    for block in entry["blocks"]:
        source = "\\n" * (block["line"] - 1) + block["code"]
        print(f"--- running {page}:{block['line']}", flush=True)
        try:
            exec(compile(source, page, "exec"), namespace)
        except BaseException:
            text = traceback.format_exc()
            print(text, file=sys.stderr, flush=True)
            print(f"FAILED: block at {page}:{block['line']}", file=sys.stderr, flush=True)
            result.update(ok=False, line=block["line"], error=text)
            break
    result["seconds"] = round(time.perf_counter() - started, 2)
    results[page] = result
    with open(results_path, "w") as f:
        json.dump(results, f)
"""


@dataclass(frozen=True)
class Run:
    """What one driver run produced: per-page results plus the process's own output."""

    results: dict[str, dict[str, object]]
    returncode: int
    stdout: str
    stderr: str

    def failure(self, page: str) -> str | None:
        """None when ``page`` passed, else a message with its traceback or why it has none."""
        result = self.results.get(page)
        if result is None:
            return (
                f"{page}: no result; the driver exited with {self.returncode} before finishing it"
                f"\n{self.stdout[-2000:]}\n{self.stderr[-6000:]}"
            )
        if not result["ok"]:
            return f"{page}: the block at line {result['line']} failed\n{result['error']}"
        return None


def run_pages(pages: dict[str, list[Block]], workdir: Path) -> Run:
    """Execute each page's runnable blocks in one fresh interpreter, page after page.

    One interpreter for all pages pays JAX's import once instead of once a page; each page
    still gets a fresh namespace and its own directory under ``workdir``, so no page sees
    another's names or files.
    """
    # The default JAX configuration a reader has: CPU, one device, no JAX settings another
    # test left in the environment. The only flags set skip the CPU backend's expensive LLVM
    # optimisation passes: they change how long compiling takes (about 40% less CPU for these
    # pages, which are mostly compilation), not what the programs compute.
    env = {
        key: value
        for key, value in os.environ.items()
        if key != "XLA_FLAGS" and not key.startswith("JAX_")
    }
    env["JAX_PLATFORMS"] = "cpu"
    env["XLA_FLAGS"] = FAST_COMPILE_FLAGS
    entries = []
    for index, (page, blocks) in enumerate(pages.items()):
        page_dir = workdir / f"page{index}"
        page_dir.mkdir(parents=True)
        entries.append(
            {
                "page": page,
                "workdir": str(page_dir),
                "blocks": [block.__dict__ for block in blocks if block.runnable],
            }
        )
    results_path = workdir / "results.json"
    process = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        input=json.dumps([entries, str(results_path)]),
        capture_output=True,
        text=True,
        cwd=workdir,
        env=env,
        timeout=RUN_TIMEOUT,
    )
    results = json.loads(results_path.read_text()) if results_path.exists() else {}
    return Run(results, process.returncode, process.stdout, process.stderr)


def _page_name(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.fixture(scope="module")
def docs_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every page of ``docs/`` run once, in one interpreter."""
    pages_blocks = {
        _page_name(path): extract_blocks(path.read_text(encoding="utf-8"), _page_name(path))
        for path in pages()
    }
    return run_pages(pages_blocks, tmp_path_factory.mktemp("docs"))


@pytest.mark.parametrize("page", pages(), ids=lambda path: str(path.relative_to(DOCS)))
def test_page_blocks_run(page: Path, docs_run: Run) -> None:
    failure = docs_run.failure(_page_name(page))
    assert failure is None, failure


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


def test_the_entry_pages_reach_everything_a_user_can_run() -> None:
    """The index links every guide; the README names the commands beyond the quickstart
    and the examples; getting-started lists every quickstart size and ``--flow``; the
    quickstart's flags in getting-started are the ones its parser has."""
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    for guide in sorted((DOCS / "guides").glob("*.md")):
        assert f"(guides/{guide.name})" in index, f"docs/index.md does not link {guide.name}"
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("dew train", "dew chain", "examples/", "--fresh", "--resume-from"):
        assert name in readme, f"README.md does not mention {name}"
    for example in sorted((ROOT / "examples").iterdir()):
        if example.name.startswith((".", "__")):
            continue
        assert example.name in readme, f"README.md does not mention examples/{example.name}"
        for part in sorted(example.glob("*.py")) + sorted(example.glob("*.yaml")):
            assert part.name in readme, (
                f"README.md does not mention examples/{example.name}/{part.name}"
            )
    started = (DOCS / "getting-started.md").read_text(encoding="utf-8")
    from dew.quickstart.command import build_parser
    from dew.quickstart.config import SIZES

    for size in SIZES:
        assert f"`{size}`" in started, f"getting-started does not name --size {size}"
    flags = {flag for action in build_parser()._actions for flag in action.option_strings}
    for flag in ("--size", "--steps", "--seed", "--flow", "--code", "--run-dir"):
        assert flag in flags and f"`{flag}" in started, f"getting-started lacks {flag}"


def test_guides_hold_only_python_code() -> None:
    """Every code block of a guide is Python (so it runs here) or ``text`` showing output."""
    for path in sorted((DOCS / "guides").glob("*.md")):
        for block in fenced_blocks(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))):
            assert block.is_python or block.language == "text", (
                f"{block.page}:{block.line}: a {block.language or 'plain'} block in a guide is "
                "never executed; write it as a python block, or show output as text"
            )


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


def test_fenced_blocks_sees_every_language() -> None:
    blocks = fenced_blocks(_SAMPLE, "sample.md")
    assert [(b.line, b.language) for b in blocks] == [
        (6, "python"),
        (10, "bash"),
        (15, "python"),
        (19, "python"),
        (23, "python"),
    ]
    assert [b.runnable for b in blocks] == [True, False, True, False, True]


def test_extract_rejects_an_unclosed_fence() -> None:
    with pytest.raises(ValueError, match="sample.md:1: fence"):
        extract_blocks("```python\nx = 1\n", "sample.md")


def test_blocks_share_one_namespace_and_skip_not_run(tmp_path: Path) -> None:
    blocks = extract_blocks(_SAMPLE + '\n```python\nassert y == 6 and z == "```"\n```\n', "s.md")
    run = run_pages({"s.md": blocks}, tmp_path)
    assert run.failure("s.md") is None, run.failure("s.md")
    assert run.results["s.md"]["ok"] is True


def test_a_block_with_a_syntax_error_fails_and_names_its_line(tmp_path: Path) -> None:
    page = "# Broken\n\n```python\nx = 1\n```\n\n```python\ndef f(:\n    pass\n```\n"
    blocks = extract_blocks(page, "broken.md")
    with pytest.raises(SyntaxError):
        compile(blocks[1].code, "broken.md", "exec")
    run = run_pages({"broken.md": blocks}, tmp_path)
    failure = run.failure("broken.md")
    assert failure is not None
    assert "SyntaxError" in failure
    assert 'File "broken.md", line 8' in failure
    assert run.results["broken.md"]["line"] == 8
    assert "FAILED: block at broken.md:8" in run.stderr


def test_a_failing_page_stops_there_and_the_next_page_still_runs(tmp_path: Path) -> None:
    raising = (
        "```python\nopen('first', 'w').close()\n```\n\n"
        "```python\nraise RuntimeError('boom')\n```\n\n"
        "```python\nopen('third', 'w').close()\n```\n"
    )
    # The second page must not see the first page's names.
    fresh = "```python\nassert 'open' not in globals() and 'first' not in dir()\nx = 1\n```\n"
    run = run_pages(
        {"raises.md": extract_blocks(raising, "raises.md"), "b.md": extract_blocks(fresh, "b.md")},
        tmp_path,
    )
    failure = run.failure("raises.md")
    assert failure is not None and "RuntimeError: boom" in failure
    assert (tmp_path / "page0" / "first").exists()
    assert not (tmp_path / "page0" / "third").exists()
    assert run.failure("b.md") is None, run.failure("b.md")


def test_names_do_not_leak_between_pages(tmp_path: Path) -> None:
    first = extract_blocks("```python\nleaked = 1\n```\n", "a.md")
    second = extract_blocks("```python\nleaked\n```\n", "b.md")
    run = run_pages({"a.md": first, "b.md": second}, tmp_path)
    assert run.failure("a.md") is None
    failure = run.failure("b.md")
    assert failure is not None and "NameError" in failure


def test_a_dying_interpreter_fails_the_pages_it_did_not_finish(tmp_path: Path) -> None:
    dies = extract_blocks("```python\nimport os\nos._exit(3)\n```\n", "dies.md")
    after = extract_blocks("```python\nx = 1\n```\n", "after.md")
    run = run_pages({"dies.md": dies, "after.md": after}, tmp_path)
    assert run.returncode == 3
    for page in ("dies.md", "after.md"):
        failure = run.failure(page)
        assert failure is not None and "no result" in failure
