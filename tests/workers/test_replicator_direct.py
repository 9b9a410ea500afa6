"""A drain's copy is sent from the shards as they lie (no pack: nothing steps until it is
delivered), and a periodic copy's buffer, mapped or not, goes back to the packer once sent.
Real holder over the real wire and real JAX arrays, in this process."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from tests.workers.ram_testing import TOKEN, holder
from workers.ram import auth as ram_auth
from workers.ram import replica, replicator


def _state(n: int) -> dict:
    return {"w": jnp.arange(n, dtype=jnp.float32), "b": jnp.ones((3,), jnp.float32),
            "step": jnp.int32(7)}


def _replicator(address) -> replicator.Replicator:
    return replicator.Replicator([("own", address)], token=TOKEN, writer="node-a",
                                 incarnation=1, source=0, sources=1, every=1, keep=2,
                                 max_host_bytes=1 << 30)


def test_a_direct_copy_holds_the_same_bytes_as_a_packed_one_and_verifies():
    h = holder()
    r = _replicator(h.serve(TOKEN, host="127.0.0.1"))
    try:
        state = _state(1 << 19)  # 2 MiB: a mapped pack buffer
        r.after_step(7, state, force=True, direct=True)
        assert r.settle(30)
        (kept,) = [c for c in h._store.all() if c.step == 7]
        layout, packed = replica.pack(state)
        assert bytes(kept.data) == bytes(packed) and kept.layout["pieces"] == layout["pieces"]
        assert ram_auth.copy_intact(ram_auth.Keys.from_token(TOKEN).copy, kept.as_dict())
        assert r.stats.sent_bytes == len(packed)
    finally:
        r.close()


def test_a_sent_copys_mapped_buffer_is_packed_into_again():
    """The pack buffer of a copy of 1 MiB or more is a populated mapping (``buffers.new``):
    once the copy is delivered the next pack reuses it instead of mapping a new one."""
    h = holder()
    r = _replicator(h.serve(TOKEN, host="127.0.0.1"))
    try:
        state = _state(1 << 19)
        r.after_step(1, state)
        assert r.settle(30)
        (first,) = r._packer._free
        r.after_step(2, state)
        assert r.settle(30)
        (again,) = r._packer._free
        assert again is first and not isinstance(first, bytearray)
        got = {c.step: np.frombuffer(c.data, np.uint8) for c in h._store.all()}
        assert sorted(got) == [1, 2] and np.array_equal(got[1], got[2])
    finally:
        r.close()
