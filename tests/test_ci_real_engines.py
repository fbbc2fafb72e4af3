"""The root conftest's real-engine rule: a test that needs the vLLM engine or a container
engine skips without one outside CI, fails without one under ``CI=true``, and the summary
counts such tests by outcome. Run on the root conftest itself in a pytester directory."""

from __future__ import annotations

import pathlib

import pytest

pytest_plugins = ["pytester"]

ROOT = pathlib.Path(__file__).resolve().parents[1]

SUITE = """
import pytest

@pytest.fixture(scope="session")
def vllm_env_python():
    pytest.skip("no vLLM virtualenv here")

@pytest.fixture(scope="session")
def container_image():
    return "image"

@pytest.fixture
def container_runner(container_image):
    return container_image

def test_needs_vllm(vllm_env_python):
    pass

def test_runs_in_a_container(container_runner):
    assert container_runner == "image"

def test_plain():
    pass
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makeconftest((ROOT / "conftest.py").read_text())
    pytester.makepyfile(test_suite=SUITE)
    return pytester


def test_without_ci_a_missing_engine_skips_and_is_counted(suite, monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, skipped=1)
    result.stdout.fnmatch_lines(
        [
            "real vLLM engine tests: 0 passed, 0 failed, 1 skipped (of 1)",
            "container engine tests: 1 passed, 0 failed, 0 skipped (of 1)",
        ]
    )


def test_under_ci_a_missing_engine_fails_saying_why(suite, monkeypatch):
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=1)
    result.stdout.fnmatch_lines(
        [
            "*CI=true needs the real vLLM engine, but the test would skip: "
            "*no vLLM virtualenv here*",
            "real vLLM engine tests: 0 passed, 1 failed, 0 skipped (of 1)",
        ]
    )
