"""Every public function documents its references and carries a doctest that passes.

The examples run as a user runs them: default JAX settings (float32, standard dtype
promotion), not the float64 and strict promotion the other test modules enter.
"""

from __future__ import annotations

import ast
import doctest
import inspect
import pathlib

import jax
import pytest

import dew.rl as rl

FUNCTIONS = sorted(name for name in rl.__all__ if callable(getattr(rl, name)))
SOURCES = pathlib.Path(rl.__file__).parent
FOUNDATIONS = {"dew.rl._checks", "dew.rl._masking", "dew.rl._token_terms"}
#: What each foundation may import: nothing, but ``_token_terms`` builds on ``_masking``.
FOUNDATION_IMPORTS = {"dew.rl._token_terms": {"dew.rl._masking"}}
#: Composition layers like ``__init__``: they import themes, and no theme imports them.
COMPOSITIONS = {"dew.rl._registry", "dew.rl._builtins"}


def test_every_public_name_but_the_constant_is_a_function() -> None:
    assert set(rl.__all__) - set(FUNCTIONS) == {"GROUP_EPS", "KL_ESTIMATORS"}
    assert len(FUNCTIONS) >= 25


@pytest.mark.parametrize("name", FUNCTIONS)
def test_docstring_has_references_and_examples(name: str) -> None:
    doc = inspect.getdoc(getattr(rl, name)) or ""
    references = doc.partition("\nReferences:\n")[2]
    assert references.strip(), f"{name}: no References: block"
    # The reference code is named by its file and its function.
    assert ".py``" in references, f"{name}: References: names no reference file"
    examples = doc.partition("\nExamples:\n")[2]
    assert ">>> import dew.rl as rl" in examples, f"{name}: no Examples: block"
    assert f"rl.{name}(" in examples, f"{name}: its example does not call it"


@pytest.mark.parametrize("name", FUNCTIONS)
def test_doctest_passes(name: str) -> None:
    function = getattr(rl, name)
    finder = doctest.DocTestFinder(recurse=False)
    tests = finder.find(function, name, globs={})
    assert tests and tests[0].examples, f"{name}: no doctest found"
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE)
    with jax.enable_x64(False), jax.numpy_dtype_promotion("standard"):
        for test in tests:
            runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
    assert result.attempted >= 3


def _dew_rl_imports(path: pathlib.Path) -> set[str]:
    """The ``dew.rl`` modules one source file imports (absolute imports only)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level:
            raise AssertionError(f"{path.name}: relative import")
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dew.rl"):
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("dew.rl")}
    return found


def test_themes_import_only_the_foundations() -> None:
    themes = [
        p
        for p in SOURCES.glob("_*.py")
        if p.name != "__init__.py" and f"dew.rl.{p.stem}" not in FOUNDATIONS | COMPOSITIONS
    ]
    assert len(themes) >= 8
    for path in themes:
        assert _dew_rl_imports(path) <= FOUNDATIONS, path.name
    for name in FOUNDATIONS:
        path = SOURCES / f"{name.rpartition('.')[2]}.py"
        assert _dew_rl_imports(path) == FOUNDATION_IMPORTS.get(name, set()), path.name
    for name in COMPOSITIONS:
        path = SOURCES / f"{name.rpartition('.')[2]}.py"
        imported = _dew_rl_imports(path)
        assert "dew.rl" not in imported, path.name  # never the package: no import cycle
        assert imported <= {f"dew.rl.{p.stem}" for p in SOURCES.glob("_*.py")}, path.name


#: Where each public name is defined: one purpose per private module (``__init__``'s layout).
LAYOUT = {
    "dew.rl._gae": {"gae", "masked_whiten"},
    "dew.rl._group": {"group_advantage", "rloo_advantage", "ragged_group_advantage"},
    "dew.rl._ratios": {"token_log_ratio", "sequence_log_ratio"},
    "dew.rl._clipped_surrogate": {"clipped_surrogate", "clipped_surrogate_terms"},
    "dew.rl._cispo": {"cispo_terms"},
    "dew.rl._value_loss": {"clipped_value_loss_terms"},
    "dew.rl._kl": {"k1_kl", "abs_kl", "k2_kl", "k3_kl", "kl_penalty"},
    "dew.rl._entropy": {"token_entropy"},
    "dew.rl._reward_shaping": {"kl_reward", "adaptive_kl_coefficient", "overlong_penalty"},
    "dew.rl._reductions": {
        "token_mean",
        "masked_mean",
        "sequence_mean",
        "sequence_sum_mean",
        "sequence_sum_norm",
        "segment_mean",
        "group_sums",
    },
    "dew.rl._corrections": {
        "behavior_importance_weights",
        "icepop_weights",
        "token_rejection_mask",
        "sequence_rejection_mask",
    },
    "dew.rl._preference": {"preference_logsigmoid"},
    "dew.rl._policy_loss": {"policy_loss"},
    "dew.rl._registry": {
        "registered",
        "register_policy_loss",
        "get_policy_loss",
        "register_advantage_estimator",
        "get_advantage_estimator",
        "register_aggregation",
        "get_aggregation",
    },
}


def test_each_public_function_lives_in_its_module() -> None:
    placed = {name: module for module, names in LAYOUT.items() for name in names}
    assert set(placed) == set(FUNCTIONS)
    for name in FUNCTIONS:
        assert getattr(rl, name).__module__ == placed[name], name
    layout = (inspect.getdoc(rl) or "").partition("never from the modules::")[2]
    for module in LAYOUT:
        assert module.rpartition(".")[2] in layout, module


def test_source_modules_stay_small() -> None:
    for path in sorted(SOURCES.glob("*.py")):
        lines = len(path.read_text().splitlines())
        assert lines < 400, f"{path.name}: {lines} lines; split it along a seam"
