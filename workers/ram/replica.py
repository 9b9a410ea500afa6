"""A process's shards of the train state as one ``bytes`` copy, and a state rebuilt from copies.

``pack`` takes, of each array, the shards whose ``replica_id`` is the array's number modulo its
replica count: every distinct shard is taken by exactly one device (so the copies of all
processes are disjoint and together cover every array once), and arrays replicated across slices
are spread over the slices' hosts instead of all landing on one. Their bytes are concatenated; the
layout records, per piece, which array and which global index it is, and each array's key path
(``names``). ``place`` builds each of a process's shards from the pieces overlapping it (only
the sources ``needed_sources`` names are fetched) and places it with the *target* sharding, so
a state copied from one mesh restores into another (a re-formed mesh); ``assemble`` builds
whole arrays on the host (the export).
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax
import numpy as np

from workers.ram import buffers

PACK_CHUNK = 32 * 1024 * 1024
"""The pack copies in pieces of at most this many bytes, spread over ``PACK_THREADS``."""
PACK_THREADS = max(1, min(4, os.cpu_count() or 1))
"""Threads a pack uses (numpy's copy releases the GIL): the step waits for the pack, and one
thread does not reach the memory bandwidth (256 MiB here: 0.05 s with one, 0.02 s with two)."""
_POOL: ThreadPoolExecutor | None = None
MAX_FREE = 1
"""Released pack buffers kept for reuse: the next pack's."""


class ReplicaMismatch(ValueError):
    """The copies do not fit this state (another model, missing pieces, a bad checksum)."""


def pack(state: Any) -> tuple[dict, bytearray]:
    """(layout, data): this process's unique shards of ``state``, bytes concatenated."""
    return Packer(state).pack(state)


class Packer:
    """``pack`` for a state whose structure and shardings do not change (one incarnation): which
    shards to take and the layout are worked out once; each pack only copies bytes."""

    def __init__(self, state: Any) -> None:
        paths, _ = jax.tree_util.tree_flatten_with_path(state)
        leaves = [leaf for _, leaf in paths]
        self._count = len(leaves)
        # (leaf index, position among the leaf's addressable shards, offset, bytes), layout order
        self._take: list[tuple[int, int, int, int]] = []
        pieces, offset = [], 0
        for i, leaf in enumerate(leaves):
            for k, shard in enumerate(leaf.addressable_shards):
                if shard.replica_id != i % _replicas(leaf):
                    continue
                shape = tuple(leaf.shape)
                index = [[s.start or 0, dim if s.stop is None else s.stop]
                         for s, dim in zip(shard.index, shape, strict=True)]
                piece_shape = [b - a for a, b in index]
                nbytes = math.prod(piece_shape) * np.dtype(leaf.dtype).itemsize
                pieces.append([i, index, np.dtype(leaf.dtype).str, piece_shape, offset, nbytes])
                self._take.append((i, k, offset, nbytes))
                offset += nbytes
        self.nbytes = offset
        # Shard k of a leaf is found by position: JAX orders an Array's shards by its sharding's
        # device assignment, so the position holds as long as the sharding is the same.
        self._shardings = [leaf.sharding for leaf in leaves]
        self.layout = {"leaves": [[list(leaf.shape), np.dtype(leaf.dtype).str]
                                  for leaf in leaves], "pieces": pieces,
                       "names": [leaf_name(path) for path, _ in paths]}
        self._free: list[bytearray] = []
        self._lock = threading.Lock()

    def release(self, data: bytearray) -> None:
        """Give back a buffer ``pack`` returned once nothing reads it any more (delivered, or
        replaced before it was sent): the next pack writes into it. A fresh buffer costs its
        first touch of every page, several times a copy into memory already touched (a 256 MiB
        buffer here: 0.4-1.7 GiB/s fresh, 11 GiB/s reused). The replicator packs only once the
        previous copy is delivered, so one buffer is in use."""
        if len(data) == self.nbytes:
            with self._lock:
                if len(self._free) < MAX_FREE and all(b is not data for b in self._free):
                    self._free.append(data)

    def _buffer(self) -> bytearray:
        with self._lock:
            if self._free:
                return self._free.pop()
        return buffers.new(self.nbytes)  # pages mapped at once: the first pack is not slower

    def pack(self, state: Any) -> tuple[dict, bytearray]:
        """Copy the shards straight into one buffer (a released one when there is one): no
        pytree walk per shard and no second concatenating copy (the step waits for this
        part)."""
        data = self._buffer()
        out = np.frombuffer(data, dtype=np.uint8)
        moves = []
        for (_i, _k, offset, nbytes), piece in zip(self._take, self.views(state), strict=True):
            for a in range(0, nbytes, PACK_CHUNK):
                moves.append((out[offset + a:offset + min(nbytes, a + PACK_CHUNK)],
                              piece[a:a + PACK_CHUNK]))
        _copy_all(moves)
        return self.layout, data

    def views(self, state: Any) -> list[np.ndarray]:
        """The copy's pieces as they lie in the shards (bytes, in layout order; no copy on a
        CPU device): what ``pack`` copies, or, while the state stays as it is until they are
        sent (a drain's copy: no step runs until it is delivered), what is sent as it is."""
        leaves = jax.tree_util.tree_leaves(state)
        if len(leaves) != self._count:
            raise ReplicaMismatch(f"the state has {len(leaves)} arrays, packed {self._count}")
        for i, (leaf, sharding) in enumerate(zip(leaves, self._shardings, strict=True)):
            if leaf.sharding is not sharding and leaf.sharding != sharding:  # same object: cheap
                raise ReplicaMismatch(f"array {i} is sharded {leaf.sharding}, the Packer was made "
                                      f"for {sharding}: make a new Packer for a new mesh")
        out = []
        for i, k, _offset, nbytes in self._take:
            # the same order as addressable_shards; one device's buffer, C-contiguous
            piece = np.asarray(leaves[i].addressable_data(k)).reshape(-1).view(np.uint8)
            if piece.size != nbytes:
                raise ReplicaMismatch(f"array {i} shard {k} is {piece.size} bytes, the layout "
                                      f"says {nbytes}: the sharding changed since the Packer")
            out.append(piece)
        return out


def _copy_all(moves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Do every (destination, source) copy: the calling thread takes one share, the pool's
    threads the others (``PACK_THREADS`` in all)."""
    global _POOL
    if PACK_THREADS == 1 or len(moves) < 2:
        _copy(moves)
        return
    if _POOL is None:
        _POOL = ThreadPoolExecutor(PACK_THREADS - 1, thread_name_prefix="ram-pack")
    shares = [moves[t::PACK_THREADS] for t in range(PACK_THREADS)]
    others = [_POOL.submit(_copy, share) for share in shares[1:]]
    _copy(shares[0])
    for f in others:
        f.result()


def _copy(moves: list[tuple[np.ndarray, np.ndarray]]) -> None:
    for dst, src in moves:
        dst[:] = src


def leaf_name(path: Sequence[Any]) -> str:
    """``params/block0/q/kernel`` from a JAX key path (dict keys, attribute names, sequence
    indices joined by ``/``): how a copy's layout names its leaves (``names``, read by
    ``python -m orchestrator.export``) and how the export names Orbax's."""
    parts = []
    for key in path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return "/".join(parts)


def _replicas(leaf: Any) -> int:
    """How many devices hold each distinct shard of ``leaf`` (e.g. the DCN data-parallel size
    for parameters sharded only inside a slice)."""
    index_map = leaf.sharding.devices_indices_map(leaf.shape)
    distinct = {tuple((s.start, s.stop) for s in index) for index in index_map.values()}
    return max(1, len(index_map) // max(1, len(distinct)))


def needed_sources(layouts: dict[int, dict], abstract_state: Any) -> list[int]:
    """The sources (of ``layouts``: source -> its copy's layout) holding a piece of any shard
    this process places of ``abstract_state``: a host fetches only those (on the mesh the copies
    were made on, its own source alone), not every host's copy."""
    return sorted(needed_pieces(layouts, abstract_state))


def needed_pieces(layouts: dict[int, dict], abstract_state: Any) -> dict[int, list[int]]:
    """Per source that has any, the pieces of its copy (indices into its layout's, ascending)
    overlapping a shard this process places: a replicated array is packed by one source, so
    every host needs a few small pieces of every other's copy, and reads just those."""
    targets = jax.tree_util.tree_leaves(abstract_state)
    wanted = [_my_indices(t) for t in targets]
    out: dict[int, list[int]] = {}
    for src, layout in sorted(layouts.items()):
        mine = [k for k, (i, index, *_rest) in enumerate(layout.get("pieces", []))
                if 0 <= i < len(wanted) and any(_overlap(index, box) is not None
                                                 for box in wanted[i])]
        if mine:
            out[src] = mine
    return out


def only_pieces(layout: dict, pieces: list[int]) -> dict:
    """``layout`` of a copy cut down to ``pieces`` (ascending indices into its pieces), their
    offsets those of the pieces' bytes read back to back (``wire.read_copy(pieces=...)``)."""
    kept, offset = [], 0
    for k in pieces:
        i, index, dtype, shape, _offset, nbytes = layout["pieces"][k]
        kept.append([i, index, dtype, shape, offset, nbytes])
        offset += nbytes
    return {**layout, "pieces": kept}


def place(copies: Sequence[tuple[dict, bytes | bytearray]], abstract_state: Any) -> Any:
    """The state ``abstract_state`` describes (shapes, dtypes, target shardings), from the
    copies, without assembling any global array: each of this process's shards is built
    from the pieces overlapping it (a piece that is exactly the shard is placed from the copy's
    bytes as they are), so a host needs only the copies ``needed_sources`` names and moves its
    own share once. ``ReplicaMismatch`` if they do not fit or do not cover its shards."""
    targets, treedef = jax.tree_util.tree_flatten(abstract_state)
    want = [[list(t.shape), np.dtype(t.dtype).str] for t in targets]
    by_leaf: list[list[tuple[list, np.ndarray]]] = [[] for _ in targets]
    for i, index, piece in _pieces(copies, want):
        by_leaf[i].append((index, piece))
    arrays = [_place_leaf(i, t, by_leaf[i]) for i, t in enumerate(targets)]
    return jax.tree_util.tree_unflatten(treedef, arrays)


def _place_leaf(i: int, target: Any, pieces: list[tuple[list, np.ndarray]]) -> Any:
    shape, dtype = tuple(target.shape), np.dtype(target.dtype)
    shards = []
    for device, index in target.sharding.addressable_devices_indices_map(shape).items():
        box = _box(index, shape)
        exact = [p for idx, p in pieces if [list(b) for b in box] == [list(x) for x in idx]]
        if exact:
            local = exact[0]
        else:
            local = np.empty([b - a for a, b in box], dtype)
            filled = 0
            for idx, piece in pieces:
                cut = _overlap(idx, box)
                if cut is None:
                    continue
                local[tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(cut, box,
                                                                               strict=True))] = \
                    piece[tuple(slice(lo - a, hi - a) for (lo, hi), (a, _) in zip(cut, idx,
                                                                                   strict=True))]
                filled += math.prod(hi - lo for lo, hi in cut)
            if filled < local.size:  # pieces are disjoint: fewer elements is a missing source
                raise ReplicaMismatch(f"array {i} is {filled}/{local.size} covered on "
                                      f"{device} by the copies: a source is missing")
        shards.append(jax.device_put(local, device))
    return jax.make_array_from_single_device_arrays(shape, target.sharding, shards)


def _box(index: tuple, shape: tuple) -> list[tuple[int, int]]:
    return [(s.start or 0, dim if s.stop is None else s.stop)
            for s, dim in zip(index, shape, strict=True)]


def _my_indices(target: Any) -> list[list[tuple[int, int]]]:
    shape = tuple(target.shape)
    return [_box(index, shape) for index in
            target.sharding.addressable_devices_indices_map(shape).values()]


def _overlap(a: Sequence[Sequence[int]], b: Sequence[Sequence[int]]
             ) -> list[tuple[int, int]] | None:
    """The box two boxes share ([(start, stop)] per dimension), None if they do not meet."""
    cut = [(max(a0, b0), min(a1, b1)) for (a0, a1), (b0, b1) in zip(a, b, strict=True)]
    return None if any(lo >= hi for lo, hi in cut) else cut


def assemble(copies: Sequence[tuple[dict, bytes]], leaves: list, *,
             only: Collection[int] | None = None) -> list[np.ndarray | None]:
    """The global arrays (host numpy) of a state whose flattened leaves are ``leaves``
    (``[(shape, dtype), ...]``), from the copies of every source; with ``only``, just those leaf
    indices (the others None: an export of the parameters alone). ``ReplicaMismatch`` if the
    copies do not fit or do not cover them."""
    want = [[list(shape), np.dtype(dtype).str] for shape, dtype in leaves]
    keep = set(range(len(want)) if only is None else only)
    full = [np.empty(shape, dtype) if i in keep else None
            for i, (shape, dtype) in enumerate(leaves)]
    filled = [0] * len(want)
    for i, index, piece in _pieces(copies, want):
        target = full[i]
        if target is not None:
            target[tuple(slice(a, b) for a, b in index)] = piece
            filled[i] += piece.size
    for i, (arr, n) in enumerate(zip(full, filled, strict=True)):
        if arr is not None and n != arr.size:
            raise ReplicaMismatch(f"array {i} is {n}/{arr.size} covered by the copies: a source "
                                  "is missing")
    return full


def _pieces(copies: Sequence[tuple[dict, bytes | bytearray]], want: list
            ) -> Iterator[tuple[int, list, np.ndarray]]:
    """(leaf index, global index, the piece: a view of the copy's bytes) of every piece of
    ``copies``, refusing copies of another state (``want``: its leaves' shapes and dtypes) or a
    piece past its copy's end."""
    for layout, data in copies:
        if layout["leaves"] != want:
            raise ReplicaMismatch("the RAM copy was written by a different model or optimizer: "
                                  + _first_difference(layout["leaves"], want))
        for i, index, dtype, shape, offset, nbytes in layout["pieces"]:
            if offset + nbytes > len(data):
                raise ReplicaMismatch(f"piece of array {i} runs past the copy's end")
            yield i, index, np.frombuffer(data, dtype=np.dtype(dtype), count=math.prod(shape),
                                          offset=offset).reshape(shape)


def _first_difference(got: list, want: list) -> str:
    if len(got) != len(want):
        return f"{len(got)} arrays, this state has {len(want)}"
    i, (g, w) = next((i, p) for i, p in enumerate(zip(got, want, strict=True)) if p[0] != p[1])
    return f"array {i} is {g[0]} {g[1]} there, {w[0]} {w[1]} here"

