"""Every distribution ships its licence, and those that port code under another licence a
NOTICE naming each source: the files are in the repository, in the wheel (``.dist-info/
licenses/``) and in the sdist, byte for byte. The test builds each distribution with uv."""

from __future__ import annotations

import os
import pathlib
import shutil
import subprocess
import tarfile
import zipfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.name for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists())
#: The distributions that port code under the Apache License 2.0 or another MIT project's
#: licence, and a source each NOTICE must name.
NOTICES = {"dew-rl": ("verl", "Tunix", "TRL"),
           "dew": ("verl", "TRL", "PEFT", "transformers", "MDLM", "BD3-LMs", "LLaDA"),
           "dew-flow": ("flow_grpo",)}  # fmt: skip


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> pathlib.Path:
    """The sdist and the wheel of every distribution, built into one folder."""
    uv = os.environ.get("UV") or shutil.which("uv")
    assert uv, "uv is needed to build the distributions (it runs the test suite)"
    out = tmp_path_factory.mktemp("dist")
    for package in PACKAGES:
        subprocess.run([uv, "build", "--package", package, "-o", str(out)], cwd=ROOT,
                       check=True, capture_output=True, timeout=300)  # fmt: skip
    return out


def expected(package: str) -> dict[str, bytes]:
    names = ["LICENSE", *(["NOTICE"] if package in NOTICES else [])]
    return {name: (ROOT / "packages" / package / name).read_bytes() for name in names}


@pytest.mark.parametrize("package", PACKAGES)
def test_the_licence_files_are_in_the_wheel_and_the_sdist(built, package):
    stem = package.replace("-", "_")
    files = expected(package)
    assert b"MIT License" in files["LICENSE"]
    (wheel,) = built.glob(f"{stem}-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        inside = {n.rsplit("/", 1)[-1]: archive.read(n) for n in archive.namelist()
                  if ".dist-info/licenses/" in n}  # fmt: skip
        metadata = next(archive.read(n) for n in archive.namelist() if n.endswith("METADATA"))
    assert inside == files
    assert b"License-Expression: MIT" in metadata
    (sdist,) = built.glob(f"{stem}-*.tar.gz")
    with tarfile.open(sdist) as archive:
        for name, content in files.items():
            member = archive.extractfile(f"{sdist.name.removesuffix('.tar.gz')}/{name}")
            assert member is not None and member.read() == content


@pytest.mark.parametrize("package", sorted(NOTICES))
def test_each_notice_names_its_sources_and_their_licences(package):
    notice = (ROOT / "packages" / package / "NOTICE").read_text()
    for source in NOTICES[package]:
        assert source in notice, (package, source)
    assert "Apache License" in notice or "MIT License" in notice
