"""The capacity-error memory (core/availability.py): exponential backoff per offering, bounded probes when a
backoff ends, forgetting after a success or a quiet cap, and the fixed TTL of before as a setting."""
from __future__ import annotations

import threading

import pytest

from ray_nodeless.core.availability import UnavailableOfferings
from ray_nodeless.core.settings import parse_provider
from ray_nodeless.errors import ConfigError
from ray_nodeless.testing.clock import FakeClock


class Offer:
    def __init__(self, name: str = "g6.xlarge", zone: str = "us-west-2a", capacity: str = "spot"):
        self.key = (name, zone, capacity)


G6 = Offer()


def memory(**kw: float) -> tuple[UnavailableOfferings, FakeClock]:
    clock = FakeClock()
    opts = dict(cap_s=600.0, probes=1) | kw
    return UnavailableOfferings(180.0, clock, cap_s=opts["cap_s"], probes=int(opts["probes"])), clock


def test_each_error_in_a_row_doubles_the_skip_up_to_the_cap():
    mem, clock = memory()
    blocks = []
    for _ in range(5):
        mem.mark(G6, "InsufficientInstanceCapacity")
        start = clock()
        while mem.blocked(G6):
            clock.advance(1)
        blocks.append(clock() - start)
        assert mem.claim(G6)                 # the probe: it fails again at the top of the loop
    assert blocks == [180, 360, 600, 600, 600]
    assert mem.wasted_probes == 4


def test_a_probe_at_a_time_then_the_others_skip_it_until_it_answers():
    mem, clock = memory(probes=1)
    mem.mark(G6, "InsufficientInstanceCapacity")
    clock.advance(181)
    assert mem.reason(G6) is None and mem.claim(G6)           # the one probe
    assert mem.reason(G6) == "InsufficientInstanceCapacity" and not mem.claim(G6)   # every other call skips it
    assert mem.states()[G6.key].probing
    mem.release(G6)                          # the probe ended without a capacity answer (a throttle, say)
    assert mem.claim(G6)
    mem.succeeded(G6)                        # it landed: forgotten, every call may use it
    assert mem.claim(G6) and mem.claim(G6) and not mem.states()


def test_a_success_resets_the_backoff():
    mem, clock = memory()
    mem.mark(G6, "x")
    clock.advance(181)
    mem.claim(G6)
    mem.mark(G6, "x")                        # second in a row: 360 s
    assert mem.states()[G6.key].remaining_s == 360
    clock.advance(361)
    mem.claim(G6)
    mem.succeeded(G6)
    mem.mark(G6, "x")                        # a new drought starts at the ttl again
    assert mem.states()[G6.key].remaining_s == 180 and mem.states()[G6.key].failures == 1


def test_errors_within_one_backoff_do_not_double_it():
    """Several calls failing on the offering at once (or a region-wide error marking every zone) are one error."""
    mem, clock = memory()
    mem.mark(G6, "x")
    clock.advance(10)
    mem.mark(G6, "y")
    st = mem.states()[G6.key]
    assert (st.failures, st.remaining_s, st.reason) == (1, 170, "y")


def test_a_quiet_offering_is_forgotten_after_the_cap():
    mem, clock = memory()
    mem.mark(G6, "x")
    clock.advance(180 + 600)                 # its backoff ended, then nothing tried it for cap_s
    assert not mem.states()
    mem.mark(G6, "x")
    assert mem.states()[G6.key].failures == 1


def test_cap_equal_to_the_ttl_and_no_probe_limit_is_the_fixed_ttl_of_before():
    mem, clock = memory(cap_s=180, probes=0)
    for _ in range(3):
        mem.mark(G6, "x")
        assert mem.states()[G6.key].remaining_s == 180
        clock.advance(180)
        assert all(mem.claim(G6) for _ in range(5))          # every call retries at once, as before


def test_a_zero_ttl_remembers_nothing():
    mem = UnavailableOfferings(0.0, FakeClock())
    mem.mark(G6, "x")
    assert mem.claim(G6) and not mem.snapshot() and not mem.states()


def test_snapshot_names_what_is_skipped_now_and_only_that():
    mem, clock = memory()
    other = Offer(zone="us-west-2b")
    mem.mark(G6, "a")
    clock.advance(100)
    mem.mark(other, "b")
    clock.advance(90)                        # G6 probing (free), other still backing off
    assert mem.snapshot() == {other.key: "b"}
    mem.claim(G6)                            # its probe is out: skipped by the others again
    assert mem.snapshot() == {G6.key: "a", other.key: "b"}


def test_concurrent_calls_take_exactly_the_probes():
    mem, clock = memory(probes=2)
    mem.mark(G6, "x")
    clock.advance(181)
    got: list[bool] = []
    threads = [threading.Thread(target=lambda: got.append(mem.claim(G6))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [False] * 14 + [True] * 2


PROVIDER = {"cloud": "local", "region": "us-west-2", "simulate_cloud": "aws"}


def test_the_settings_and_a_cap_below_the_ttl_named():
    core = parse_provider(dict(PROVIDER))
    assert (core.unavailable_ttl_s, core.unavailable_backoff_cap_s, core.unavailable_probes) == (180, 600, 1)
    with pytest.raises(ConfigError) as e:
        parse_provider(dict(PROVIDER, unavailable_ttl_s=300, unavailable_backoff_cap_s=60))
    assert e.value.key == "provider.unavailable_backoff_cap_s"
    assert "shorter than provider.unavailable_ttl_s" in str(e.value)
    with pytest.raises(ConfigError) as e:
        parse_provider(dict(PROVIDER, unavailable_probes=-1))
    assert e.value.key == "provider.unavailable_probes"
