"""Which hosts a hang is about (issue 28, item 11): the host that did not answer, is behind, or
never entered the step the others wait in, never every host still inside the phase."""

from __future__ import annotations

from policies.hangs import HangObservation, Whereabouts, name_hung


def _where(step: int, *, inside: bool, calls: tuple[str, ...] = ("run_steps",)) -> Whereabouts:
    return Whereabouts(step=step, entered=step + 1 if inside else step, calls=calls)


def _obs(phase: str, answers: dict[int, Whereabouts | None]) -> HangObservation:
    return HangObservation(phase=phase, pending=tuple(sorted(answers)), answers=answers,
                           probe_s=2.0)


def test_a_step_hang_names_the_host_that_never_entered_the_step_the_others_wait_in():
    v = name_hung(_obs("step", {0: _where(7, inside=True), 1: _where(7, inside=False),
                                2: _where(7, inside=True)}))
    assert (v.hosts, v.waiting) == ((1,), (0, 2))
    assert v.describe("step", 15) == (
        "step did not finish within 15s on hosts [1] (host 1 never entered step 8 (the "
        "others wait in it); hosts [0, 2] waited for them)")


def test_a_host_steps_behind_or_silent_is_named():
    v = name_hung(_obs("step", {0: _where(9, inside=True), 1: _where(6, inside=True),
                                2: None, 3: _where(9, inside=True)}))
    assert v.hosts == (1, 2)
    assert v.reasons == {1: "was at step 6 (others at 9)", 2: "did not answer within 2s"}


def test_a_save_hang_names_the_host_not_in_the_save():
    saving = ("save",)
    v = name_hung(_obs("save", {0: _where(10, inside=False, calls=saving),
                                1: _where(10, inside=False, calls=()),
                                2: _where(10, inside=False, calls=saving)}))
    assert v.hosts == (1,)
    assert v.reasons == {1: "was not in the save (in no call)"}


def test_a_restore_from_ram_counts_as_inside_the_restore():
    v = name_hung(_obs("restore", {0: _where(0, inside=False, calls=("restore_from_ram",)),
                                   1: _where(0, inside=False, calls=("restore",))}))
    assert (v.hosts, v.reasons) == ((0, 1), {})


def test_hosts_that_cannot_be_told_apart_are_all_named():
    v = name_hung(_obs("save", {0: _where(10, inside=False, calls=("save",)),
                                1: _where(10, inside=False, calls=("save",))}))
    assert (v.hosts, v.reasons, v.waiting) == ((0, 1), {}, ())
    assert v.describe("save", 30) == ("save did not finish within 30s on hosts [0, 1] (asked "
                                      "where they were, none could be told apart)")


def test_only_pending_hosts_are_named_and_compared():
    """A host whose call returned is ahead by definition; it makes no pending host behind."""
    answers = {0: _where(20, inside=False), 1: _where(7, inside=True), 2: _where(7, inside=True)}
    v = name_hung(HangObservation(phase="step", pending=(1, 2), answers=answers, probe_s=2.0))
    assert v.hosts == (1, 2) and v.reasons == {}
