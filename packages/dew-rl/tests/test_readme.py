"""The python blocks of dew-rl's README run, in order, in one namespace (a block may use
what an earlier one defined), so the examples a reader copies cannot drift from the API."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_readme_python_blocks_run_in_order():
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3, f"expected the README's examples, found {len(blocks)} blocks"
    namespace: dict = {}
    for number, block in enumerate(blocks, 1):
        exec(compile(block, f"{README.name} python block {number}", "exec"), namespace)
    assert {"loss", "fused", "grad", "log_ratio"} <= namespace.keys()
