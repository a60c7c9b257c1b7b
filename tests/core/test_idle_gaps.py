"""The learned idle release's rule (core/idle_gaps.py): per node type, the timeout that would have cost least over
its recent idle gaps; the break-even until a gap is seen."""
from __future__ import annotations

import pytest

from ray_nodeless.core.idle_gaps import GapLearner

L = 180.0          # a launch
BE = 180.0         # the break-even (the type's timeout in Ray)


def learner(**kw) -> GapLearner:
    return GapLearner(launch_s=L, window=kw.pop("window", 5), min_gap_s=kw.pop("min_gap_s", 5.0))


def gap(g: GapLearner, t: str, machine: str, start: float, length: float) -> None:
    """A machine of `t` idle from `start` and busy again `length` later."""
    g.idle(t, machine, start)
    g.busy(t, machine, start + length)


def test_no_gap_seen_keeps_the_break_even_and_never_is_never_shortened_without_evidence() -> None:
    g = learner()
    assert g.timeout_s("gpu", BE, now=0) == BE
    assert g.timeout_s("gpu", None, now=0) is None
    assert g.gaps("gpu", now=0) == []


def test_gaps_longer_than_a_launch_release_at_once() -> None:
    g = learner()
    for i in range(3):
        gap(g, "gpu", f"m{i}", start=1000 * i, length=600)
    assert g.gaps("gpu", now=5000) == [600, 600, 600]
    assert g.timeout_s("gpu", BE, now=5000) == 5.0
    assert g.timeout_s("gpu", None, now=5000) == 5.0          # "never" is shortened too, on evidence
    assert g.timeout_s("gpu", 3.0, now=5000) == 3.0           # never longer than the type's own timeout
    assert g.timeout_s("cpu", BE, now=5000) == BE             # per type


def test_gaps_shorter_than_a_launch_keep_the_machine_through_them() -> None:
    g = learner()
    for i in range(3):
        gap(g, "gpu", f"m{i}", start=1000 * i, length=40)
    # Keeping costs the 3 x 40 s whatever the timeout above 40 s; releasing at once would cost 3 launches. On such
    # a tie the longest timeout: an unseen 50-s gap then costs 50 s, not 45 s and a launch.
    assert g.timeout_s("gpu", BE, now=5000) == BE
    gap(g, "gpu", "m3", start=6000, length=600)
    # One long gap in four: keeping 45 s (the short gaps plus one sampling step) costs 3 x 40 + 45 + a launch;
    # the break-even 3 x 40 + 180 + a launch; releasing at once 4 launches.
    assert g.timeout_s("gpu", BE, now=9000) == 45.0


def test_a_mix_chooses_the_cheaper_over_the_window() -> None:
    g = learner()
    for i, length in enumerate([30, 30, 30, 30, 900]):        # one long gap in five: keep 35 s
        gap(g, "gpu", f"m{i}", start=2000 * i, length=length)
    assert g.timeout_s("gpu", BE, now=20000) == 35.0
    for i in range(3):        # the window (5) moves on: 4 long gaps in 5, yet 35 s still costs less (30 s once)
        gap(g, "gpu", f"n{i}", start=30000 + 2000 * i, length=900)
    assert g.gaps("gpu", now=50000) == [30, 900, 900, 900, 900]
    assert g.timeout_s("gpu", BE, now=50000) == 35.0
    gap(g, "gpu", "n9", start=60000, length=900)            # every gap long: release at once
    assert g.timeout_s("gpu", BE, now=70000) == 5.0


def test_a_hand_over_shorter_than_min_gap_is_not_a_gap() -> None:
    g = learner()
    gap(g, "gpu", "m", start=0, length=2)
    assert g.gaps("gpu", now=100) == []


def test_a_released_machines_gap_closes_at_the_types_next_launch() -> None:
    g = learner()
    g.idle("gpu", "m", 100)
    g.released("gpu", "m", 280)                 # Ray ended it after its 180 s
    g.launched("gpu", 400)                      # work came back 300 s after it went idle
    assert g.gaps("gpu", now=400) == [300]
    g.launched("gpu", 500)                      # no released machine left: nothing to close
    assert g.gaps("gpu", now=500) == [300]


def test_the_most_recently_released_gap_closes_first() -> None:
    g = learner()
    g.idle("gpu", "a", 0)
    g.idle("gpu", "b", 100)
    g.released("gpu", "a", 10)
    g.released("gpu", "b", 110)
    g.launched("gpu", 150)                      # b's 50 s closes (the shorter reading); a's stays open
    assert g.gaps("gpu", now=150) == [50]


def test_an_open_gap_longer_than_a_launch_counts_as_long_and_says_when() -> None:
    g = learner()
    g.idle("gpu", "m", 1000)
    assert g.changes_at("gpu", now=1000) == 1000 + L
    assert g.gaps("gpu", now=1000 + L) == []                       # not longer yet
    assert g.gaps("gpu", now=1000 + L + 1) == [L + 1]
    assert g.timeout_s("gpu", BE, now=1000 + L + 1) == 5.0
    g.busy("gpu", "m", 2000)
    assert g.gaps("gpu", now=2000) == [1000]
    assert g.changes_at("gpu", now=2000) is None


def test_a_new_idle_since_closes_the_gap_before() -> None:
    g = learner()
    g.idle("gpu", "m", 0)
    g.idle("gpu", "m", 0)                       # seen idle again: the same gap
    g.idle("gpu", "m", 60)                      # busy in between: the first gap lasted at most 60 s
    assert g.gaps("gpu", now=60) == [60]


def test_a_machine_that_ended_busy_leaves_no_open_gap() -> None:
    g = learner()
    g.idle("gpu", "m", 0)
    g.forget("m")
    assert g.gaps("gpu", now=10_000) == []


def test_bad_parameters_are_refused() -> None:
    for kw in ({"window": 0}, {"launch_s": -1}, {"min_gap_s": -1}):
        with pytest.raises(ValueError):
            GapLearner(**{"launch_s": 1.0, **kw})
