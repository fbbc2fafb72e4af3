"""Release one Dew distribution on its own.

    uv run python tools/release.py dew-rl minor        # or patch, major, or 0.3.0
    uv run python tools/release.py dew --dry-run patch  # say what would change

Steps, in order, stopping at the first problem with nothing half-written:

1. read ``packages/<dist>/pyproject.toml`` and compute the new version;
2. check that every other workspace distribution's requirement on ``<dist>``
   still admits the new version (a bump past ``<0.2`` must be released together
   with the dependents' range change, so the tool refuses instead);
3. write the new version and move the CHANGELOG's ``## Unreleased`` entries under
   a dated heading for it (both files replaced atomically), then refresh
   ``uv.lock``;
4. build the sdist and the wheel with ``uv build --package <dist>``;
5. print the tag, ``<dist>-v<version>``, on the last line.

It does not commit, tag or upload: those stay with the person releasing.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import tomllib

from packaging.requirements import Requirement
from packaging.version import Version

VERSION_LINE = re.compile(r'^version\s*=\s*"([^"]+)"\s*$', re.MULTILINE)
UNRELEASED = "## Unreleased"


class ReleaseError(RuntimeError):
    """A release cannot go ahead; the message says which file and why."""


def workspace_packages(root: pathlib.Path) -> dict[str, pathlib.Path]:
    """Distribution name -> its directory, for every member under ``packages/``."""
    found = {}
    for pyproject in sorted((root / "packages").glob("*/pyproject.toml")):
        found[tomllib.loads(pyproject.read_text())["project"]["name"]] = pyproject.parent
    return found


def next_version(current: str, bump: str) -> str:
    """``patch``, ``minor`` or ``major`` applied to ``current``, or ``bump`` itself if it is a version."""
    old = Version(current)
    if bump == "major":
        return f"{old.major + 1}.0.0"
    if bump == "minor":
        return f"{old.major}.{old.minor + 1}.0"
    if bump == "patch":
        return f"{old.major}.{old.minor}.{old.micro + 1}"
    new = Version(bump)  # raises InvalidVersion with the offending text
    if new <= old:
        raise ReleaseError(f"version: expected something above {old}, got {new}")
    return str(new)


def broken_dependents(root: pathlib.Path, dist: str, version: str) -> list[str]:
    """Requirements on ``dist`` elsewhere in the workspace that ``version`` would not satisfy."""
    broken = []
    for name, directory in workspace_packages(root).items():
        meta = tomllib.loads((directory / "pyproject.toml").read_text())
        for text in meta["project"].get("dependencies", []):
            requirement = Requirement(text)
            if requirement.name == dist and not requirement.specifier.contains(
                version, prereleases=True
            ):
                broken.append(f"{name} requires {text!r}")
    return broken


def changelog_with_release(text: str, version: str, date: str, path: pathlib.Path) -> str:
    """Move the entries under ``## Unreleased`` to a ``## <version> (<date>)`` section."""
    if UNRELEASED not in text:
        raise ReleaseError(f"{path}: expected a '{UNRELEASED}' section, found none")
    head, _, rest = text.partition(UNRELEASED)
    next_heading = rest.find("\n## ")
    entries = rest if next_heading < 0 else rest[:next_heading]
    tail = "" if next_heading < 0 else rest[next_heading:]
    if not entries.strip():
        raise ReleaseError(f"{path}: the '{UNRELEASED}' section is empty; nothing to release")
    return f"{head}{UNRELEASED}\n\n## {version} ({date})\n{entries.rstrip()}\n{tail}"


def write_atomically(path: pathlib.Path, text: str) -> None:
    """Replace ``path`` with ``text`` through a temporary file in the same folder.

    Not ``dew.files.atomic_write``: this tool releases every distribution, dew-rl and
    dew-sandbox included, and runs with the standard library alone.
    """
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        pathlib.Path(temp).unlink(missing_ok=True)
        raise


def release(
    root: pathlib.Path, dist: str, bump: str, *, build: bool = True, dry_run: bool = False
) -> str:
    """Bump, record and build ``dist``; returns its tag."""
    packages = workspace_packages(root)
    if dist not in packages:
        raise ReleaseError(f"distribution: expected one of {sorted(packages)}, got {dist!r}")
    pyproject = packages[dist] / "pyproject.toml"
    changelog = packages[dist] / "CHANGELOG.md"
    text = pyproject.read_text()
    match = VERSION_LINE.search(text)
    if match is None:
        raise ReleaseError(f"{pyproject}: expected a static 'version = \"...\"' line")
    version = next_version(match.group(1), bump)
    broken = broken_dependents(root, dist, version)
    if broken:
        raise ReleaseError(
            f"{dist} {version} would fall outside the ranges other distributions ask for: "
            + "; ".join(broken)
            + ". Widen those ranges in the same release."
        )
    today = datetime.date.today().isoformat()
    new_changelog = changelog_with_release(changelog.read_text(), version, today, changelog)
    tag = f"{dist}-v{version}"
    if dry_run:
        print(f"{dist}: {match.group(1)} -> {version} (dry run, nothing written)")
        return tag
    new_pyproject = text[: match.start(1)] + version + text[match.end(1) :]
    write_atomically(pyproject, new_pyproject)
    write_atomically(changelog, new_changelog)
    if (root / "uv.lock").exists():
        subprocess.run(["uv", "lock", "--quiet"], cwd=root, check=True)
    if build:
        subprocess.run(
            ["uv", "build", "--quiet", "--package", dist, "-o", str(root / "dist")],
            cwd=root,
            check=True,
        )
    return tag


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("distribution", help="workspace distribution name, e.g. dew-rl")
    parser.add_argument("bump", help="patch, minor, major, or an explicit version")
    parser.add_argument("--root", type=pathlib.Path, default=pathlib.Path(__file__).parents[1])
    parser.add_argument("--no-build", action="store_true", help="skip uv build")
    parser.add_argument("--dry-run", action="store_true", help="check and report only")
    args = parser.parse_args(argv)
    try:
        tag = release(
            args.root.resolve(),
            args.distribution,
            args.bump,
            build=not args.no_build,
            dry_run=args.dry_run,
        )
    except (ReleaseError, ValueError) as error:
        print(f"release: {error}", file=sys.stderr)
        return 2
    print(tag)
    return 0


if __name__ == "__main__":
    sys.exit(main())
