"""``dew.progress.TerminalBar``: the tqdm bar of the episode collection and the scheduler."""

from __future__ import annotations

import io

from dew.progress import TerminalBar
from dew.testing import TerminalStream as Terminal


def draws(stream: io.StringIO) -> list[str]:
    """Every state drawn, in order (tqdm redraws a line after a carriage return)."""
    return [d.rstrip("\n") for d in stream.getvalue().split("\r")[1:]]


def test_counts_total_and_detail_on_a_terminal():
    stream = Terminal(True)
    bar = TerminalBar("rollouts", "groups", stream)
    bar.update(0, 16, "40 in flight, waited 0.00s")
    assert bar.open
    bar.update(8, 16, "40 in flight, waited 0.31s")
    bar.update(9, 18, "12 in flight, waited 0.50s")  # the total may change
    bar.close()
    assert not bar.open
    shown = draws(stream)
    assert shown[0] == "rollouts:   0%|          | 0/16 groups [00:00, 40 in flight, waited 0.00s]"
    assert shown[1] == "rollouts:  50%|#####     | 8/16 groups [00:00, 40 in flight, waited 0.31s]"
    assert shown[-1] == "rollouts:  50%|#####     | 9/18 groups [00:00, 12 in flight, waited 0.50s]"
    assert stream.getvalue().endswith("]\n") and stream.getvalue().count("\n") == 1


def test_a_closed_bar_starts_a_new_line_on_the_next_update():
    stream = Terminal(True)
    bar = TerminalBar("episodes", "episodes", stream)
    bar.update(4, 4, "turns 8, tool 0.1s")
    bar.close()
    bar.close()  # closing twice writes nothing more
    bar.update(1, 2, "turns 1, tool 0.0s")
    bar.close()
    lines = stream.getvalue().split("\n")
    assert len(lines) == 3 and lines[2] == ""
    assert lines[0].endswith("4/4 episodes [00:00, turns 8, tool 0.1s]")
    assert lines[1].startswith("\repisodes:  50%|#####") and "1/2 episodes" in lines[1]


def test_detail_only_changes_are_throttled_but_the_last_state_is_drawn():
    stream = Terminal(True)
    bar = TerminalBar("rollouts", "groups", stream, interval=3600.0)
    bar.update(1, 4, "waited 0.10s")
    bar.update(1, 4, "waited 0.20s")  # same count, inside the interval: not redrawn
    assert not any("0.20s" in d for d in draws(stream))
    bar.update(2, 4, "waited 0.30s")  # the count moved: redrawn at once
    assert draws(stream)[-1].endswith("2/4 groups [00:00, waited 0.30s]")
    bar.update(2, 4, "waited 0.40s")
    bar.close()  # the last state is drawn on close
    assert draws(stream)[-1].endswith("2/4 groups [00:00, waited 0.40s]")


def test_nothing_is_written_off_a_terminal_or_when_disabled():
    plain = Terminal(False)
    bar = TerminalBar("rollouts", "groups", plain)
    bar.update(1, 2, "3 in flight")
    assert not bar.enabled and not bar.open  # no tqdm object is built either
    bar.close()
    assert plain.getvalue() == ""
    quiet = Terminal(True)
    off = TerminalBar("rollouts", "groups", quiet, enabled=False)
    off.update(1, 2)
    off.close()
    assert quiet.getvalue() == ""
    forced = Terminal(False)
    on = TerminalBar("rollouts", "groups", forced, enabled=True)
    on.update(1, 2)
    on.close()
    assert draws(forced)[-1] == "rollouts:  50%|#####     | 1/2 groups [00:00]"


def test_stderr_is_the_default_stream(monkeypatch):
    import sys

    stream = Terminal(True)
    monkeypatch.setattr(sys, "stderr", stream)
    bar = TerminalBar("episodes", "episodes")
    bar.update(3, 4, "turns 5, tool 1.2s")
    bar.close()
    assert draws(stream) == [
        "episodes:  75%|#######5  | 3/4 episodes [00:00, turns 5, tool 1.2s]",
        "episodes:  75%|#######5  | 3/4 episodes [00:00, turns 5, tool 1.2s]",
    ]
