"""The shared compile's decisions (workers/training/compile_share.py) with a fake store, word and
jitted function: who compiles, who waits, what the owner says, and every way back to compiling. The
real thing (two JAX processes, the runtime's key-value store) is in
tests/workers/test_executables.py."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from workers.training.compile_share import STORED, Share, obtain, owner_of, shares
from workers.training.executables import Lookup, key_digest

KEY = {"function": "train_step", "process": {"index": 0, "count": 2}}


class FakeStore:
    def __init__(self, *, has: bool = False, writable: bool = True, loads: bool = True) -> None:
        self.has, self.writable, self.loads = has, writable, loads
        self.saved = 0
        self.load_calls = 0

    def path(self, key):
        return f"/store/{key_digest(key)}"

    def load(self, key, *, args, devices):
        self.load_calls += 1
        if not self.has:
            return Lookup(None, "no executable stored for this key yet")
        if not self.loads:
            return Lookup(None, "file.xla is unreadable (ValueError: damaged)", damaged=True)
        return Lookup("LOADED", "", {"flops": 7.0})

    def save(self, key, compiled, *, meta=None):
        if not self.writable:
            return None
        self.has = True
        self.saved += 1
        return 0.01


@dataclass
class FakeWord:
    words: dict = field(default_factory=dict)
    said: list = field(default_factory=list)
    heard: list = field(default_factory=list)
    fail_say: bool = False

    def say(self, digest, word):
        if self.fail_say:
            raise RuntimeError("coordination service gone")
        self.said.append(word)
        self.words[digest] = word

    def hear(self, digest, timeout_s):
        self.heard.append(timeout_s)
        return self.words.get(digest)


class FakeJitted:
    def __init__(self, *, fails: bool = False) -> None:
        self.compiles = 0
        self.fails = fails

    def lower(self, *args):
        jitted = self

        class Lowered:
            def compile(self):
                if jitted.fails:
                    raise RuntimeError("XLA said no")
                jitted.compiles += 1
                return "COMPILED"

            def cost_analysis(self):
                return {"flops": 3.0}

        return Lowered()


def _obtain(store, jitted, share, **kw):
    return obtain("train_step", jitted, (), store=store, key=KEY, devices=None, share=share,
                  **kw)


def test_owner_compiles_stores_and_says_stored():
    store, word, jitted = FakeStore(), FakeWord(), FakeJitted()
    compiled, info = _obtain(store, jitted, Share(owner=0, me=0, wait_s=5, word=word), cost=True)
    assert (compiled, info.source, info.flops, info.waited_s) == ("COMPILED", "compiled", 3.0, 0)
    assert store.saved == 1 and word.said == [STORED] and word.heard == []


def test_owner_that_loads_says_stored_too():
    word = FakeWord()
    compiled, info = _obtain(FakeStore(has=True), FakeJitted(),
                             Share(owner=0, me=0, wait_s=5, word=word))
    assert (compiled, info.source, info.flops) == ("LOADED", "loaded", 7.0)
    assert word.said == [STORED]


def test_other_process_waits_for_the_word_then_loads_without_compiling():
    store, jitted = FakeStore(), FakeJitted()

    class OwnerFinishesMeanwhile(FakeWord):
        def hear(self, digest, timeout_s):  # the owner compiles while this process waits
            _obtain(store, FakeJitted(), Share(owner=0, me=0, wait_s=5, word=self))
            return super().hear(digest, timeout_s)

    word = OwnerFinishesMeanwhile()
    compiled, info = _obtain(store, jitted, Share(owner=0, me=1, wait_s=5, word=word))
    assert (compiled, info.source, jitted.compiles, store.saved) == ("LOADED", "loaded", 0, 1)
    assert word.heard == [5] and word.said == [STORED]


def test_a_file_there_already_is_loaded_without_waiting():
    word = FakeWord()
    compiled, _ = _obtain(FakeStore(has=True), FakeJitted(),
                          Share(owner=0, me=1, wait_s=5, word=word))
    assert compiled == "LOADED" and word.heard == [] and word.said == []


@pytest.mark.parametrize("said, reason", [
    (None, "no word from process 0 in 5s"),
    ("it could not be written", "process 0 did not store it (it could not be written)"),
    ("its compile failed", "process 0 did not store it (its compile failed)"),
])
def test_no_word_or_a_bad_word_means_compile_here(said, reason):
    word = FakeWord(words={key_digest(KEY): said} if said else {})
    store, jitted = FakeStore(), FakeJitted()
    compiled, info = _obtain(store, jitted, Share(owner=0, me=1, wait_s=5, word=word))
    assert (compiled, info.source, jitted.compiles, info.reason) == (
        "COMPILED", "compiled", 1, reason)
    assert word.said == []  # only the owner speaks


def test_stored_but_unloadable_here_compiles_and_says_why():
    word = FakeWord(words={key_digest(KEY): STORED})
    jitted = FakeJitted()
    compiled, info = _obtain(FakeStore(has=False, loads=False), jitted,
                             Share(owner=0, me=1, wait_s=5, word=word))
    assert compiled == "COMPILED" and jitted.compiles == 1
    assert info.reason.startswith("process 0's executable: ")


def test_owner_whose_compile_raises_still_tells_the_others():
    word = FakeWord()
    with pytest.raises(RuntimeError, match="XLA said no"):
        _obtain(FakeStore(), FakeJitted(fails=True), Share(owner=0, me=0, wait_s=5, word=word))
    assert word.said == ["its compile failed"]


def test_a_word_that_cannot_be_said_never_fails_the_owner():
    word = FakeWord(fail_say=True)
    compiled, info = _obtain(FakeStore(), FakeJitted(), Share(owner=0, me=0, wait_s=5, word=word))
    assert (compiled, info.source) == ("COMPILED", "compiled")


def test_without_a_store_everyone_compiles():
    jitted = FakeJitted()
    compiled, info = obtain("init", jitted, (), store=None, key=None, devices=None,
                            share=None)
    assert (compiled, info.source, info.key) == ("COMPILED", "compiled", None)
    assert "compile.cache=off" in info.reason and jitted.compiles == 1


@pytest.mark.parametrize("kw, expected", [
    ({}, True),
    ({"platform": "tpu"}, False),
    ({"enabled": False}, False),
    ({"processes": 1}, False),
    ({"store": False}, False),
])
def test_only_the_cpu_emulation_with_a_store_and_several_processes_shares(kw, expected):
    args = {"platform": "cpu", "enabled": True, "processes": 2, "store": True, **kw}
    assert shares(**args) is expected


def test_the_owner_is_the_lowest_process_of_the_mesh():
    @dataclass
    class Dev:
        process_index: int

    assert owner_of([Dev(3), Dev(1), Dev(2)]) == 1


def test_no_runtime_to_share_over_means_every_process_compiles(caplog):
    """share_for in a process without a JAX distributed runtime (or where the private API it
    uses moved): no Share, a warning, never an exception."""
    from workers.training.compile_share import share_for

    @dataclass
    class Dev:
        process_index: int

    got = share_for([Dev(0), Dev(1)], platform="cpu", enabled=True, store=True, wait_s=5)
    assert got is None
    assert "every process compiles its own" in caplog.text
    assert share_for([Dev(0), Dev(1)], platform="tpu", enabled=True, store=True,
                     wait_s=5) is None


def test_the_wait_leaves_room_for_a_compile_of_its_own_in_the_phase():
    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import plan_mesh

    cfg = load_config(None, ["timeouts.compile_s=300", "timeouts.restore_s=100"])
    hosts = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}",
                     node_ip="127.0.0.1", instance=f"vm-{i}", devices=2) for i in range(2)]
    plan = plan_mesh(cfg, hosts, platform="cpu", hosts_per_slice=2)
    spec = HostSpec.for_host(cfg, plan, plan.hosts[1], checkpoint_dir="/tmp/c")
    assert spec.share_wait_s == 50.0 and spec.share_compile is True
