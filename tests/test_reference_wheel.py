"""``tools/reference_wheel.py``, the provenance helpers every fixture recorder shares.

Loaded from its file (the recorders are scripts run in the reference virtualenv, not a
package). Only the offline paths run here: a hash given on the command line and a wheel
already on disk; the ``pip download`` fallback needs the registry.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

PATH = Path(__file__).resolve().parents[1] / "tools" / "reference_wheel.py"
spec = importlib.util.spec_from_file_location("reference_wheel", PATH)
assert spec is not None and spec.loader is not None
reference_wheel = importlib.util.module_from_spec(spec)
sys.modules.setdefault("reference_wheel", reference_wheel)
spec.loader.exec_module(reference_wheel)


def test_a_given_hash_wins(tmp_path, monkeypatch):
    monkeypatch.setenv("DEW_VERL_WHEEL_DIR", str(tmp_path))
    (tmp_path / "trl-1.16.0-py3-none-any.whl").write_bytes(b"not this one")
    assert reference_wheel.wheel_sha256("trl", "1.16.0", "ab" * 32) == "ab" * 32


def test_a_local_wheel_of_that_version_is_hashed(tmp_path, monkeypatch):
    monkeypatch.setenv("DEW_VERL_WHEEL_DIR", str(tmp_path))
    (tmp_path / "trl-1.15.0-py3-none-any.whl").write_bytes(b"older")
    (tmp_path / "trl-1.16.0-py3-none-any.whl").write_bytes(b"the wheel")
    (tmp_path / "verl-0.9.1-py3-none-any.whl").write_bytes(b"another package")
    want = hashlib.sha256(b"the wheel").hexdigest()
    assert reference_wheel.wheel_sha256("trl", "1.16.0") == want
    # a dashed name is looked up with underscores, as wheel files spell it
    (tmp_path / "dew_rl-0.1.0-py3-none-any.whl").write_bytes(b"dew-rl")
    found = reference_wheel.wheel_sha256("dew-rl", "0.1.0")
    assert found == hashlib.sha256(b"dew-rl").hexdigest()


def test_atomic_write_replaces_whole_files_readable_by_all(tmp_path):
    target = tmp_path / "sub" / "case.json"
    reference_wheel.atomic_write(target, lambda tmp: Path(tmp).write_text("{}\n"))
    assert target.read_text() == "{}\n"
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644

    def broken(tmp: str) -> None:
        Path(tmp).write_text("half")
        raise RuntimeError("the recorder failed")

    with pytest.raises(RuntimeError, match="the recorder failed"):
        reference_wheel.atomic_write(target, broken)
    assert target.read_text() == "{}\n"  # the old file stays whole
    assert sorted(p.name for p in target.parent.iterdir()) == ["case.json"]  # no temp left
