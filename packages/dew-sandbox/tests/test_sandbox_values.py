"""SandboxLimits, Program and Outcome: validation names the field, values round-trip."""

from __future__ import annotations

import pytest

from dew.sandbox import Outcome, Program, SandboxLimits, Verdict


def test_limits_defaults_and_cpu_rlimit() -> None:
    limits = SandboxLimits(cpu_seconds=1.2)
    assert limits.cpu_rlimit == (2, 3)
    assert SandboxLimits(cpu_seconds=3).cpu_rlimit == (3, 4)
    with pytest.raises(AttributeError):
        limits.cpu_seconds = 5  # type: ignore[misc]


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"cpu_seconds": 0}, ValueError, r"SandboxLimits\.cpu_seconds: expected a positive"),
        ({"deadline_seconds": float("inf")}, ValueError, r"deadline_seconds.*got inf"),
        ({"output_bytes": 1.5}, TypeError, r"output_bytes: expected a positive integer"),
        ({"processes": True}, TypeError, r"processes: expected a positive integer, got bool"),
        ({"memory_bytes": 1 << 20}, ValueError, r"memory_bytes: expected at least 6 MiB"),
        ({"address_space_bytes": "1G"}, TypeError, r"address_space_bytes.*got str"),
    ],
)
def test_limits_reject_bad_values(kwargs: dict, error: type, match: str) -> None:
    with pytest.raises(error, match=match):
        SandboxLimits(**kwargs)


def test_program_normalises_text_to_bytes(tmp_path) -> None:
    program = Program(
        {"a/b/main.py": "print('é')", "data.bin": b"\x00\x01"},
        ["python3", "a/b/main.py"],
        stdin="in",
    )
    assert program.stdin == b"in" and program.argv == ("python3", "a/b/main.py")
    program.write_into(tmp_path)
    assert (tmp_path / "a" / "b" / "main.py").read_text(encoding="utf-8") == "print('é')"
    assert (tmp_path / "data.bin").read_bytes() == b"\x00\x01"
    assert oct((tmp_path / "data.bin").stat().st_mode & 0o777) == "0o644"


@pytest.mark.parametrize(
    ("files", "argv", "stdin", "match"),
    [
        (
            {"/etc/passwd": "x"},
            ["true"],
            b"",
            r"Program\.files: expected relative paths.*'/etc/passwd'",
        ),
        ({"../up.py": "x"}, ["true"], b"", r"'\.\./up\.py'"),
        ({"": "x"}, ["true"], b"", r"Program\.files"),
        ({"a.py": 3}, ["true"], b"", r"Program\.files\['a\.py'\]: expected str or bytes, got int"),
        ({}, [], b"", r"Program\.argv: expected at least the command"),
        ({}, "python3 main.py", b"", r"Program\.argv: expected a sequence of strings, got str"),
        ({}, ["a\x00b"], b"", r"Program\.argv\[0\]: expected a str without NUL"),
        ({}, ["true"], 5, r"Program\.stdin: expected str or bytes, got int"),
    ],
)
def test_program_rejects_bad_input(files, argv, stdin, match: str) -> None:
    with pytest.raises((TypeError, ValueError), match=match):
        Program(files, argv, stdin=stdin)


def test_outcome_helpers() -> None:
    outcome = Outcome(Verdict.COMPLETED, 0, "ok ✓\n".encode(), b"", 0.1)
    assert outcome.ok and outcome.text() == "ok ✓\n"
    assert not Outcome(Verdict.FAILED, 1, b"\xff", b"", 0.1).ok
    assert Outcome(Verdict.FAILED, 1, b"\xff", b"", 0.1).text() == "\ufffd"
