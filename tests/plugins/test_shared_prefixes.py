"""The ttft-cost-scorer's shared prefixes: a key is shared from its ``shares``-th sighting; the working set sums
the shared keys' tokens, loses a key unseen for the window or pushed out of the bounded table, and counts it again
from scratch when it comes back."""

from __future__ import annotations

from epp.plugins.scorers.shared_prefixes import SharedPrefixes


def test_a_prefix_joins_the_working_set_at_its_shares_th_sighting_and_once() -> None:
    shared = SharedPrefixes(shares=3, window=30)
    for now in (0.0, 1.0):
        shared.sighted(1, 2000, now)
    assert shared.sightings(1) == 2 and shared.working_set(1.0) == 0
    shared.sighted(1, 2000, 2.0)
    assert shared.working_set(2.0) == 2000
    shared.sighted(1, 2000, 3.0)                         # later sightings do not count its tokens again
    shared.sighted(2, 500, 3.0)                          # another prefix, seen once: not shared
    assert shared.working_set(3.0) == 2000
    assert shared.sightings(3) == 0


def test_a_prefix_unseen_for_the_window_leaves_and_must_be_shared_again() -> None:
    shared = SharedPrefixes(shares=2, window=30)
    for key, tokens in ((1, 2000), (2, 1000)):
        shared.sighted(key, tokens, 0.0)
        shared.sighted(key, tokens, 0.0)
    shared.sighted(2, 1000, 20.0)                        # key 2 stays fresh
    assert shared.working_set(30.0) == 3000              # 30 s unseen: still within the window
    assert shared.working_set(30.5) == 1000              # key 1 left
    assert shared.sightings(1) == 0
    shared.sighted(1, 2000, 31.0)
    assert shared.working_set(31.0) == 1000              # one sighting since it came back: not shared yet


def test_the_table_is_bounded_and_the_least_recently_seen_leaves_first() -> None:
    shared = SharedPrefixes(shares=1, window=1e9, capacity=3)
    for key in range(5):
        shared.sighted(key, 100, float(key))
    shared.sighted(2, 100, 5.0)                          # key 2 is now the most recent
    shared.sighted(5, 100, 6.0)
    assert [shared.sightings(k) for k in range(6)] == [0, 0, 2, 0, 1, 1]
    assert shared.working_set(6.0) == 300                # only what is remembered counts
