"""Which tier a restore uses, and who holds whose copy (pure: no Ray, no JAX)."""

from __future__ import annotations

from policies.ram_tier import ReplicaEntry, choose_tier, peer_nodes, peers


def entry(step: int, source: int, *, holder: str = "h0", sources: int = 2, incarnation: int = 1,
          intact: bool = True) -> ReplicaEntry:
    return ReplicaEntry(holder=holder, incarnation=incarnation, step=step, source=source,
                        sources=sources, nbytes=100, intact=intact)


def test_peer_is_the_same_position_in_the_next_slice():
    assert peers(["a", "a", "b", "b"]) == {0: 2, 1: 3, 2: 0, 3: 1}
    assert peers(["a", "a", "b", "b", "c", "c"]) == {0: 2, 1: 3, 2: 4, 3: 5, 4: 0, 5: 1}


def test_one_slice_uses_the_next_host_and_a_lone_host_has_no_peer():
    assert peers(["a", "a", "a"]) == {0: 1, 1: 2, 2: 0}
    assert peers(["a"]) == {0: None}
    assert peers(["a", "b"]) == {0: 1, 1: 0}


def test_newest_complete_ram_step_beats_an_older_durable_step():
    got = choose_tier([entry(7, 0), entry(7, 1, holder="h1"), entry(8, 0)], durable_step=5)
    assert (got.tier, got.step, got.incarnation) == ("ram", 7, 1)
    assert got.holders == {0: "h0", 1: "h1"}
    assert got.nbytes == 200


def test_replicas_at_different_steps_use_the_newest_common_one():
    entries = [entry(5, 0), entry(6, 0), entry(6, 1), entry(7, 1)]
    assert choose_tier(entries, durable_step=None).step == 6


def test_durable_wins_when_newer_and_ram_wins_a_tie():
    entries = [entry(5, 0), entry(5, 1)]
    assert choose_tier(entries, durable_step=6).tier == "durable"
    assert choose_tier(entries, durable_step=6).step == 6
    assert choose_tier(entries, durable_step=5).tier == "ram"


def test_damaged_copy_is_replaced_by_another_holders_copy_or_falls_back():
    bad = entry(9, 1, holder="h1", intact=False)
    good = entry(9, 1, holder="h2")
    with_peer = choose_tier([entry(9, 0), bad, good], durable_step=4)
    assert (with_peer.tier, with_peer.step, with_peer.holders[1]) == ("ram", 9, "h2")
    alone = choose_tier([entry(9, 0), bad], durable_step=4)
    assert (alone.tier, alone.step) == ("durable", 4)
    assert "1 damaged copy ignored" in alone.reason


def test_lost_holder_with_its_host_falls_back_to_durable():
    # source 1's copies lived only on the node that died
    got = choose_tier([entry(12, 0), entry(11, 0)], durable_step=10)
    assert (got.tier, got.step) == ("durable", 10)
    assert choose_tier([], durable_step=None).step is None


def test_a_set_never_mixes_incarnations():
    entries = [entry(6, 0, incarnation=1), entry(6, 1, incarnation=2),
               entry(4, 0, incarnation=1), entry(4, 1, incarnation=1)]
    got = choose_tier(entries, durable_step=None)
    assert (got.step, got.incarnation) == (4, 1)
    newer = choose_tier([*entries, entry(6, 0, incarnation=2)], durable_step=None)
    assert (newer.step, newer.incarnation) == (6, 2)


def test_excluded_steps_are_passed_over():
    entries = [entry(6, 0), entry(6, 1), entry(5, 0), entry(5, 1)]
    assert choose_tier(entries, durable_step=None, exclude_steps={6}).step == 5


def test_a_copy_saved_from_ram_is_a_durable_candidate():
    got = choose_tier([entry(5, 0)], durable_step=4, copy_step=6)
    assert (got.tier, got.step) == ("copy", 6)
    assert choose_tier([entry(6, 0), entry(6, 1)], durable_step=4, copy_step=6).tier == "ram"
    assert choose_tier([], durable_step=6, copy_step=6).tier == "durable"
    fresh = choose_tier([], durable_step=None)
    assert (fresh.tier, fresh.step) == ("durable", None)


def test_peer_nodes_put_a_one_slice_meshs_copies_on_the_warm_spare():
    mesh = [("a", "a0"), ("a", "a1")]
    # no spare: the next host of the slice (a notice for the slice takes both)
    assert peer_nodes(mesh) == ["a1", "a0"]
    # a spare slice kept warm: the same position there (the first spare slice only)
    assert peer_nodes(mesh, [("s", "s0"), ("s", "s1"), ("t", "t0")]) == ["s0", "s1"]
    assert peer_nodes(mesh, [("s", "s0")]) == ["s0", "s0"]
    # several slices: peers in the next slice, the spare is not needed
    two = [("a", "a0"), ("b", "b0")]
    assert peer_nodes(two, [("s", "s0")]) == ["b0", "a0"]
    assert peer_nodes([("a", "a0")]) == [None]
