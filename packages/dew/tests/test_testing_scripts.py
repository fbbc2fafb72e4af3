"""dew.testing.load_script: a script file loaded as an independent module, bad paths named."""

from __future__ import annotations

import pytest

from dew.testing import load_script


def test_a_script_runs_as_a_module_and_each_load_is_fresh(tmp_path):
    script = tmp_path / "example_script.py"
    script.write_text("COUNT = [0]\n\ndef bump():\n    COUNT[0] += 1\n    return COUNT[0]\n")
    first = load_script(script)
    assert first.__name__ == "example_script" and first.bump() == 1 and first.bump() == 2
    second = load_script(script, name="again")
    assert second.__name__ == "again" and second.bump() == 1  # its own top level ran


def test_missing_and_non_python_paths_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere.py"):
        load_script(tmp_path / "nowhere.py")
    text = tmp_path / "notes.txt"
    text.write_text("x = 1\n")
    with pytest.raises(ValueError, match=r"must be a \.py file.*notes\.txt"):
        load_script(text)


def test_what_the_script_raises_propagates(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("raise RuntimeError('top level failed')\n")
    with pytest.raises(RuntimeError, match="top level failed"):
        load_script(script)
