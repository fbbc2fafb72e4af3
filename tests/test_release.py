"""tools/release.py on a throwaway copy of the workspace."""

from __future__ import annotations

import importlib.util
import pathlib
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load_release():
    spec = importlib.util.spec_from_file_location("dew_release_tool", ROOT / "tools" / "release.py")
    module = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(module)
    return module


release_tool = _load_release()


@pytest.fixture()
def workspace(tmp_path: pathlib.Path) -> pathlib.Path:
    """The root pyproject, the lock and every distribution's sources, nothing else."""
    copy = tmp_path / "ws"
    copy.mkdir()
    for name in ("pyproject.toml", "uv.lock"):
        shutil.copy(ROOT / name, copy / name)
    for package in (ROOT / "packages").iterdir():
        if (package / "pyproject.toml").exists():
            shutil.copytree(
                package,
                copy / "packages" / package.name,
                ignore=shutil.ignore_patterns("__pycache__", "tests", "*.egg-info"),
            )
    return copy


def _version(root: pathlib.Path, dist: str) -> str:
    meta = tomllib.loads((root / "packages" / dist / "pyproject.toml").read_text())
    return meta["project"]["version"]


def test_next_version_rules() -> None:
    assert release_tool.next_version("0.1.0", "patch") == "0.1.1"
    assert release_tool.next_version("0.1.3", "minor") == "0.2.0"
    assert release_tool.next_version("0.4.2", "major") == "1.0.0"
    assert release_tool.next_version("0.1.0", "0.1.5") == "0.1.5"
    with pytest.raises(release_tool.ReleaseError, match="above 0.1.0"):
        release_tool.next_version("0.1.0", "0.1.0")


def test_release_bumps_records_builds_and_prints_tag(workspace: pathlib.Path) -> None:
    if shutil.which("uv") is None:
        pytest.fail("uv must be on PATH: .ci/run installs it")
    before = _version(workspace, "dew-rl")
    result = subprocess.run(
        [
            sys.executable,
            str(ROOT / "tools" / "release.py"),
            "dew-rl",
            "patch",
            "--root",
            str(workspace),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    after = release_tool.next_version(before, "patch")
    assert result.stdout.strip().splitlines()[-1] == f"dew-rl-v{after}"
    assert _version(workspace, "dew-rl") == after
    changelog = (workspace / "packages" / "dew-rl" / "CHANGELOG.md").read_text()
    assert f"## {after} (" in changelog
    assert changelog.index("## Unreleased") < changelog.index(f"## {after} (")
    lock = (workspace / "uv.lock").read_text()
    assert f'name = "dew-rl"\nversion = "{after}"' in lock
    built = sorted(p.name for p in (workspace / "dist").iterdir())
    assert f"dew_rl-{after}-py3-none-any.whl" in built
    assert f"dew_rl-{after}.tar.gz" in built
    # The others are untouched.
    assert _version(workspace, "dew") == _version(ROOT, "dew")


def test_release_refuses_a_version_dependents_exclude(workspace: pathlib.Path) -> None:
    pyproject = workspace / "packages" / "dew-rl" / "pyproject.toml"
    changelog = workspace / "packages" / "dew-rl" / "CHANGELOG.md"
    before = (pyproject.read_text(), changelog.read_text())
    with pytest.raises(release_tool.ReleaseError, match="dew requires"):
        release_tool.release(workspace, "dew-rl", "major", build=False)
    assert (pyproject.read_text(), changelog.read_text()) == before


def test_release_refuses_an_empty_unreleased_section(workspace: pathlib.Path) -> None:
    changelog = workspace / "packages" / "dew-sandbox" / "CHANGELOG.md"
    changelog.write_text("# Changelog\n\n## Unreleased\n\n## 0.1.0 (2026-01-01)\n- x\n")
    with pytest.raises(release_tool.ReleaseError, match="empty"):
        release_tool.release(workspace, "dew-sandbox", "patch", build=False)
    assert _version(workspace, "dew-sandbox") == _version(ROOT, "dew-sandbox")


def test_release_names_an_unknown_distribution(workspace: pathlib.Path) -> None:
    with pytest.raises(release_tool.ReleaseError, match="expected one of"):
        release_tool.release(workspace, "dew-nope", "patch", build=False)


def test_build_all_packages_from_a_clean_copy(workspace: pathlib.Path) -> None:
    out = workspace / "all"
    subprocess.run(
        ["uv", "build", "--quiet", "--all-packages", "-o", str(out)], cwd=workspace, check=True
    )
    wheels = {p.name.split("-")[0] for p in out.glob("*.whl")}
    names = {p.name.replace("-", "_") for p in (workspace / "packages").iterdir()}
    assert wheels == names
