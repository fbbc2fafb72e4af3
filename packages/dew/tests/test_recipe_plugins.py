"""dew.recipes.plugins: entry points found by name, and named errors when they are not."""

from __future__ import annotations

from importlib.metadata import EntryPoint

import pytest

from dew.recipes import plugins
from dew.recipes.schema import ConfigError


def _points(*points: EntryPoint):
    def entry_points(*, group, name):
        return [p for p in points if p.group == group and p.name == name]

    return entry_points


def test_a_registered_name_loads(monkeypatch):
    point = EntryPoint("thing", "dew.recipes.schema:ConfigError", plugins.GROUP)
    monkeypatch.setattr(plugins, "entry_points", _points(point))
    assert plugins.load_plugin("thing", "objective.reward", "dew-x") is ConfigError


def test_a_missing_name_names_the_key_and_distribution(monkeypatch):
    point = EntryPoint("other", "dew.recipes.schema:ConfigError", plugins.GROUP)
    monkeypatch.setattr(plugins, "entry_points", _points(point))
    with pytest.raises(ConfigError) as err:
        plugins.load_plugin("thing", "rollout.mode", "dew-rollout")
    assert str(err.value).startswith("rollout.mode: needs the dew-rollout distribution")
    assert "'thing'" in str(err.value) and "\n" not in str(err.value)


def test_a_broken_plugin_is_named(monkeypatch):
    point = EntryPoint("thing", "dew_no_such_module_xyz:f", plugins.GROUP)
    monkeypatch.setattr(plugins, "entry_points", _points(point))
    with pytest.raises(ConfigError, match=r"^objective\.reward: dew_no_such_module_xyz:f does "
                       r"not load \(ModuleNotFoundError"):  # fmt: skip
        plugins.load_plugin("thing", "objective.reward", "dew-sandbox")
