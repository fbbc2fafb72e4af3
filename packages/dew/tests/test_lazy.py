"""``dew.lazy.lazy_exports``: names resolve on first read, modules stand for themselves,
unknown names fail as Python's own lookup does, and nothing is imported early."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import types

import pytest

from dew.lazy import lazy_exports


def test_names_modules_and_relative_paths_resolve() -> None:
    package = types.ModuleType("dew_lazy_probe")
    sys.modules[package.__name__] = package
    try:
        get, listing, names = lazy_exports(
            package.__name__, {"dumps": "json", "decoder": "json.decoder", "sqrt": "math"}
        )
        import json
        import json.decoder
        import math

        assert get("dumps") is json.dumps
        assert get("decoder") is json.decoder  # the last part of the path: the module
        assert get("sqrt") is math.sqrt
        assert names == ["decoder", "dumps", "sqrt"]
        assert set(names) <= set(listing())
        with pytest.raises(AttributeError, match="'dew_lazy_probe' has no attribute 'loads'"):
            get("loads")
    finally:
        del sys.modules[package.__name__]


def test_a_relative_path_resolves_against_the_package() -> None:
    get, _, _ = lazy_exports("dew", {"lazy_exports": ".lazy"})
    assert get("lazy_exports") is lazy_exports


def test_an_empty_module_path_is_refused() -> None:
    with pytest.raises(ValueError, match="dew.x: the module of 'y' is empty"):
        lazy_exports("dew.x", {"y": ""})


def test_dew_packages_import_nothing_until_a_name_is_read() -> None:
    code = textwrap.dedent(
        """
        import sys
        import dew.sessions, dew.rollouts, dew.recipes
        assert "jax" not in sys.modules
        import dew.objectives.rl
        heavy = [m for m in ("dew.inference", "dew.rollouts.sampled") if m in sys.modules]
        assert heavy == [], heavy
        assert "pack" in dir(dew.sessions)
        dew.sessions.Session
        assert "dew.sessions.records" in sys.modules
        assert "dew.rollouts.sampled" not in sys.modules
        dew.objectives.rl.SampledRollout
        assert "dew.rollouts.sampled" in sys.modules
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True)
