"""The ttft-cost-scorer's prefix homes: a prefix gets a home at its second sighting, on the endpoint home to the
fewest; both tables stay bounded; a removed endpoint's prefixes get a new home among the live ones."""

from __future__ import annotations

from epp.plugins.scorers.prefix_homes import MAX_PREFIXES, PrefixHomes

NAMES = ["e0", "e1", "e2"]


def test_a_prefix_seen_once_has_no_home_and_its_second_request_gives_it_one() -> None:
    homes = PrefixHomes()
    assert homes.home(1, NAMES) == (None, False)       # never seen
    homes.seen(1, "e1")
    assert homes.home(1, []) == (None, False)          # no candidate this time: the sighting is kept
    assert homes.home(1, NAMES) == ("e1", True)        # every endpoint is home to none: the first one's stays
    assert homes.home(1, NAMES) == ("e1", False)       # given once
    homes.seen(1, "e2")                                # later requests elsewhere do not move it
    assert homes.home(1, NAMES) == ("e1", False)


def test_homes_spread_one_per_endpoint_before_any_gets_a_second() -> None:
    homes = PrefixHomes()
    for key in range(6):
        homes.seen(key, "e0")                          # every prefix's first request went to e0
    given = [homes.home(key, NAMES)[0] for key in range(6)]
    assert given == ["e0", "e1", "e2", "e0", "e1", "e2"]


def test_a_home_that_is_not_a_candidate_is_none_for_that_request() -> None:
    homes = PrefixHomes()
    homes.seen(7, "e2")
    assert homes.home(7, NAMES) == ("e2", True)
    assert homes.home(7, ["e0", "e1"]) == (None, False)  # filtered out this time; the home stays
    assert homes.home(7, NAMES) == ("e2", False)


def test_a_removed_endpoints_prefixes_get_a_home_among_the_others_at_their_next_request() -> None:
    homes = PrefixHomes()
    homes.seen(1, "e0")
    homes.seen(2, "e1")
    assert homes.home(1, NAMES)[0] == "e0" and homes.home(2, NAMES)[0] == "e1"
    homes.remove_endpoint("e0")
    assert homes.home(1, ["e1", "e2"]) == ("e2", True)  # e1 is already home to one


def test_both_tables_are_bounded_oldest_first() -> None:
    homes = PrefixHomes(capacity=4)
    for key in range(10):                              # unrelated prompts, each seen once
        homes.seen(key, "e0")
    assert homes.home(0, NAMES) == (None, False)       # pushed out
    assert homes.home(9, NAMES) == ("e0", True)
    for key in range(100, 110):
        homes.seen(key, "e1")
        homes.home(key, NAMES)
    assert len(homes) == 4
    assert homes.home(100, NAMES) == (None, False)
    assert MAX_PREFIXES >= 1024
