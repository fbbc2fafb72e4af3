"""Test setup shared by every suite of the workspace (pytest loads this file first, from the
root, for tests under ``tests/`` and ``packages/*/tests``).

JAX's persistent compilation cache stays off in tests (``DEW_COMPILE_CACHE=0``, inherited by
every subprocess a test starts): the ``Trainer`` and the ``dew`` command line would otherwise
write compiled programs into the user's ``~/.cache/dew/jax``. A test of the cache passes its
own directory and turns it on explicitly (``packages/dew/tests/test_compile_cache.py``).

A test that needs a real engine (the vLLM CPU engine's virtualenv, fixture
``vllm_env_python``; a container engine, fixture ``container_image``) is marked for it at
collection. Under ``CI=true`` its skip (no engine here) is turned into a failure, and every
suite's summary says how many such tests passed, failed and skipped
(``tests/test_ci_real_engines.py``).
"""

import os

import pytest

os.environ["DEW_COMPILE_CACHE"] = "0"


# Tests that need a real engine, found by the fixture that provides it. Outside CI such a
# test skips saying why the engine is missing; under ``CI=true`` that skip is a failure, so
# a green CI run always carries real-engine evidence. Each suite's summary counts them.
REAL_ENGINES = {
    "vllm_env_python": ("real_vllm", "real vLLM engine"),
    "container_image": ("real_container", "container engine"),
}
#: Per marker, each marked test's outcome in this session (``passed``, ``failed``, ``skipped``).
_OUTCOMES: dict[str, dict[str, str]] = {marker: {} for marker, _ in REAL_ENGINES.values()}


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def pytest_configure(config):
    for marker, what in REAL_ENGINES.values():
        config.addinivalue_line("markers", f"{marker}: needs the {what} (fails under CI=true)")


def pytest_collection_modifyitems(items):
    for item in items:
        for fixture, (marker, _) in REAL_ENGINES.items():
            if fixture in getattr(item, "fixturenames", ()):
                item.add_marker(marker)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if not (report.skipped and _under_ci()):
        return
    for marker, what in REAL_ENGINES.values():
        if item.get_closest_marker(marker) is not None:
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
            report.outcome = "failed"
            report.longrepr = f"CI=true needs the {what}, but the test would skip: {reason}"
            return


def pytest_runtest_logreport(report):
    # on the xdist controller too: a worker's report carries the test's markers as keywords
    for marker, _ in REAL_ENGINES.values():
        if marker not in report.keywords:
            continue
        outcomes = _OUTCOMES[marker]
        if report.failed or outcomes.get(report.nodeid) == "failed":
            outcomes[report.nodeid] = "failed"
        elif report.skipped:
            outcomes[report.nodeid] = "skipped"
        elif report.when == "call":
            outcomes[report.nodeid] = "passed"


def pytest_terminal_summary(terminalreporter):
    if hasattr(terminalreporter.config, "workerinput"):
        return  # an xdist worker: the controller prints the counts
    for marker, what in REAL_ENGINES.values():
        outcomes = list(_OUTCOMES[marker].values())
        if outcomes:
            counts = ", ".join(f"{outcomes.count(k)} {k}" for k in ("passed", "failed", "skipped"))
            terminalreporter.write_line(f"{what} tests: {counts} (of {len(outcomes)})")
