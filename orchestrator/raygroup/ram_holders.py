"""The driver's side of the host-RAM tier: one detached holder actor per node, found by name.

Holders are named ``ram-<run key>-<node id>`` in the ``tpu-orchestrator`` namespace and detached,
so they outlive the host actors of an incarnation (kill -9, re-form) and the driver itself
(autoresume finds them by name and restores from them). ``release`` kills them when the run is
over; a run that ended in failure keeps them for the autoresume that brings it back.

The run's secret (``token``) authenticates hosts to holders and every copy end to end
(``workers.ram.auth``). It lives in ``RUN_DIR/ram_secret`` (mode 0600; the run directory is
trusted, like its checkpoints), so a later driver of the run (autoresume) can still use the
holders and check the copies an earlier one left; a run directory started afresh gets a new one.
Holder names are predictable and anyone on the cluster can list them, so the driver hands the
token only to a holder that first proves it has it, bound to its own name (``RamHolder.prove``,
a fresh challenge each time): an actor created first under a holder's name is skipped, never
served.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import ray
import structlog
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from orchestrator.controller.seam import Restored
from orchestrator.shared import layout as ckpt_layout
from orchestrator.shared.files import atomic_write_text
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.plan import MeshPlan
from orchestrator.shared.sections import RamTierConfig
from policies.ram_tier import ReplicaEntry, TierChoice, choose_tier, peer_nodes
from workers.ram import auth as ram_auth
from workers.ram import copy_store
from workers.ram.holder import RamHolder

log = structlog.get_logger(__name__)

NAMESPACE = "tpu-orchestrator"
SECRET_FILE = "ram_secret"
_RemoteHolder = ray.remote(RamHolder)
_NOT_OURS = ("left out, never handed the token: it cannot prove it holds this run's secret. "
             "Unless it is a holder of an earlier secret of this run, kill it "
             "(ray.kill(ray.get_actor('{name}', namespace='" + NAMESPACE + "'))); the run's "
             "release kills it too")


def run_key(name: str, run_dir: str) -> str:
    """Holders of one run (name and directory): another run never reads its copies."""
    return f"{name}-{hashlib.sha256(run_dir.encode()).hexdigest()[:8]}"


def run_secret(run_dir: Path, *, fresh: bool = False) -> tuple[str, bool]:
    """(the run's RAM-tier secret, whether it was made now): read from ``run_dir``, or made
    and written there (owner-only, write + rename) when ``fresh`` or there is none. Read only
    from a private file of the run's user (``read_private``: never through a link), else
    ``UnsafeFile`` (the driver: exit 2): a secret others chose or can read forges copies."""
    from orchestrator.shared.files import read_private

    path = run_dir / SECRET_FILE
    if not fresh:
        data = read_private(path, fix=(
            f"remove {path} (`rm {path}`): the driver then writes a new secret, owner-only; RAM "
            "copies made under the old one are not restored (the run resumes from its durable "
            "checkpoint) and holders of the old one are released. Let only the run's user "
            "write and read its directory"))
        token = (data or b"").decode("utf-8", "replace").strip()
        if token:
            return token, False
    token = secrets.token_hex(32)
    run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, token + "\n", mode=0o600)
    return token, True


class RamTier:
    """Creates, lists, asks and releases one run's holders."""

    def __init__(self, cfg: RamTierConfig, *, key: str, token: str, checkpoint_dir: str,
                 checkpoint_keep: int, timeout_s: float = 10.0) -> None:
        self.cfg = cfg
        self.prefix = f"ram-{key}-"
        self.token = token
        """The run's secret: hosts prove it to the holders and authenticate copies with it."""
        self.persist_dir = (str(copy_store.copies_dir(checkpoint_dir))
                            if cfg.durable_from_ram else None)
        self.persist_keep = checkpoint_keep
        self.timeout_s = timeout_s
        self._copies_seen: dict[int, int] = {}
        self._dropped_below = 0

    @classmethod
    def for_config(cls, cfg: Any, *, fresh: bool = False) -> RamTier | None:
        """The tier of a run config (``checkpoint.ram``), or None when it is off; ``fresh``:
        a new secret (the copies of an earlier one can no longer be used). Holders left with a
        secret that is gone are released. ``enabled: auto`` counts as off here: the driver
        decides it first (``orchestrator.driver.protection``)."""
        if cfg.checkpoint.ram.enabled is not True:
            return None
        run_dir = Path(cfg.run.run_dir).absolute()
        token, made = run_secret(run_dir, fresh=fresh)
        ram = cls(cfg.checkpoint.ram, key=run_key(cfg.run.name, str(run_dir)), token=token,
                  checkpoint_dir=str(run_dir / "checkpoints"), checkpoint_keep=cfg.checkpoint.keep)
        if made and (stale := ram.release()):
            log.warning("ram_tier_stale_released", holders=stale,
                        why="their copies were made under another secret")
        return ram

    @classmethod
    def for_run(cls, cfg: Any, run_dir: Path) -> RamTier | None:
        """``for_config``, for a driver starting in ``run_dir``: a directory with no timeline is
        a new run, so copies an earlier run of the same name and directory left are released
        (and a new secret made)."""
        return cls.for_config(cfg, fresh=not (run_dir / "timeline.jsonl").exists())

    def finish(self, *, succeeded: bool) -> str:
        """The summary line on what the holders keep; release them when the run is over, keep
        them for autoresume when it failed. Never raises: the run's outcome is decided."""
        try:
            stats = self.stats()
            kept = [v.get("nbytes", 0) for v in stats.values()]
            line = (f"  RAM tier: {len(stats)} holder(s), {sum(kept)} bytes kept "
                    f"({max(kept, default=0)} on the largest node)")
            if succeeded:
                self.release()
            else:
                log.warning("ram_tier_kept", holders=len(stats),
                            fix="rerun with the same run.name and run.run_dir to resume from "
                                "them, or start a fresh run directory (its first start "
                                "releases them)")
            return line
        except Exception as exc:
            log.warning("ram_tier_finish_failed", error=str(exc)[:300])
            return ""

    def holder(self, node_id: str) -> tuple[str, Any]:
        """This run's holder on ``node_id`` (created if it is not there yet)."""
        name = self.prefix + node_id
        handle = _RemoteHolder.options(
            name=name, namespace=NAMESPACE, lifetime="detached", get_if_exists=True,
            num_cpus=0, max_concurrency=4, max_restarts=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
        ).remote(token=self.token, keep=self.cfg.keep,
                 max_copy_bytes=(None if self.cfg.cap_bytes is None
                                 else max(1, self.cfg.cap_bytes
                                          // (self.cfg.holder_sources * self.cfg.keep))),
                 persist_dir=self.persist_dir, persist_keep=self.persist_keep)
        return name, handle

    def assignments(self, plan: MeshPlan, spare: Sequence[HostRef] = ()
                    ) -> list[list[tuple[str, Any]]]:
        """Per host: its own node's holder, then its peer's (``policies.ram_tier.peer_nodes``:
        another slice's host, or a ``spare`` host kept warm when the mesh is one slice);
        ``checkpoint.ram.holders: peer``: the peer's only (its own node's when it has none)."""
        peer_of = peer_nodes([(h.slice_name, h.node_id) for h in plan.hosts],
                             [(h.slice_name, h.node_id) for h in spare])
        out = []
        for h, peer in zip(plan.hosts, peer_of, strict=True):
            nodes = [h.node_id] if peer is None or peer == h.node_id else (
                [peer] if self.cfg.holders == "peer" else [h.node_id, peer])
            out.append([self.holder(node) for node in nodes])
        return out

    def holders(self) -> dict[str, Any]:
        """Every live holder of this run, by name (also those an earlier driver created): those
        under its names that prove they are its own (``ours``)."""
        return self.ours(self._named(), self.timeout_s)

    def ours(self, named: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        """Those of ``named`` that answer a fresh challenge with this run's secret, bound to
        their own name (one holder's answer cannot pass for another's); only these are ever
        handed the token. Anything else (an actor created first under one of the run's names,
        a holder of an older secret, a dead or slow one) is left out and logged."""
        nonce = secrets.token_hex(16)
        refs: dict[str, Any] = {}
        for name, h in named.items():
            try:
                refs[name] = h.prove.remote(nonce)
            except AttributeError:  # an actor of another class: it has no ``prove``
                log.warning("ram_holder_not_ours", holder=name, fix=_NOT_OURS.format(name=name))
        ready, _ = (ray.wait(list(refs.values()), num_returns=len(refs), timeout=timeout_s)
                    if refs else ([], []))
        found: dict[str, Any] = {}
        for name, ref in refs.items():
            if ref not in ready:
                log.warning("ram_holder_slow", holder=name)
                continue
            try:
                answer = ray.get(ref)
            except Exception as exc:  # its node is gone, or it is no holder at all
                log.warning("ram_holder_lost", holder=name, error=str(exc)[:200])
                continue
            want = ram_auth.holder_proof(self.token, nonce, name)
            if isinstance(answer, str) and ram_auth.same_token(answer, want):
                found[name] = named[name]
            else:
                log.warning("ram_holder_not_ours", holder=name, fix=_NOT_OURS.format(name=name))
        return found

    def _named(self) -> dict[str, Any]:
        """Every live actor under this run's holder names, whoever created it."""
        found: dict[str, Any] = {}
        for a in ray.util.list_named_actors(all_namespaces=True):
            if a.get("namespace") != NAMESPACE or not a.get("name", "").startswith(self.prefix):
                continue
            try:
                found[a["name"]] = ray.get_actor(a["name"], namespace=NAMESPACE)
            except ValueError:  # gone between listing and lookup
                continue
        return found

    def inventory(self) -> list[ReplicaEntry]:
        """What every reachable holder has; a dead or slow holder is left out (logged)."""
        handles = self.holders()
        refs = {name: h.inventory.remote(self.token) for name, h in handles.items()}
        ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=self.timeout_s)
        entries: list[ReplicaEntry] = []
        for name, ref in refs.items():
            if ref not in ready:
                log.warning("ram_holder_slow", holder=name)
                continue
            try:
                entries.extend(ReplicaEntry(holder=name, **e) for e in ray.get(ref))
            except Exception as exc:  # its node is gone: its copies with it
                log.warning("ram_holder_lost", holder=name, error=str(exc)[:200])
        return entries

    def choose(self, durable_step: int | None, *, copy_step: int | None = None,
               exclude_steps: Collection[int] = ()) -> TierChoice:
        try:
            entries = self.inventory()
        except Exception as exc:  # the tier is an optimisation: the durable tier still works
            log.warning("ram_inventory_failed", error=str(exc)[:300])
            return choose_tier([], durable_step, copy_step=copy_step,
                               exclude_steps=exclude_steps)
        return choose_tier(entries, durable_step, copy_step=copy_step,
                           exclude_steps=exclude_steps)

    def pick(self, checkpoint_dir: str, skip_steps: Collection[int] = ()) -> TierChoice:
        """The tier to restore from, against the newest committed durable step on disk."""
        on_disk = ckpt_layout.committed_steps(checkpoint_dir)
        durable = max((s for s in on_disk if s not in skip_steps), default=None)
        saved = copy_store.complete_steps(copy_store.copies_dir(checkpoint_dir))
        copied = max((s for s in saved if s not in skip_steps), default=None)
        choice = self.choose(durable, copy_step=copied)
        log.info("restore_tier", tier=choice.tier, step=choice.step, reason=choice.reason)
        return choice

    def attach_calls(self, actors: Sequence[Any], plan: MeshPlan, *, incarnation: int,
                     spare: Sequence[HostRef] = ()) -> list[Any]:
        """Start every host copying to its holders (refs for the group to wait on); ``spare``:
        the hosts kept warm on spare slices (``assignments``)."""
        assign = self.assignments(plan, spare)
        handles = self.ours({name: h for mine in assign for name, h in mine},
                            max(30.0, self.timeout_s))  # a new holder's process starts first
        names = list(handles)
        served = ray.get([handles[n].serve.remote(self.token, durable=self.cfg.durable_from_ram)
                          for n in names],
                         timeout=max(30.0, self.timeout_s))
        address = {n: (str(a[0]), int(a[1])) for n, a in zip(names, served, strict=True)}
        return [a.attach_ram.remote([(n, address[n]) for n, _ in assign[i] if n in address],
                                    token=self.token,
                                    incarnation=incarnation, every=self.cfg.first_every,
                                    keep=self.cfg.keep, max_host_bytes=self.cfg.cap_bytes,
                                    holder_sources=self.cfg.holder_sources,
                                    durable_from_ram=self.cfg.durable_from_ram)
                for i, a in enumerate(actors)]

    def restore_calls(self, actors: Sequence[Any], choice: TierChoice) -> list[Any]:
        """Every host rebuilds ``choice.step`` from the copies (in RAM, or saved on disk for
        tier "copy"); [] if a holder is gone. A RAM restore reads the copies over the holders'
        wire (``workers.ram.wire.read_copy``), not through Ray's object store: only the copies
        each host needs, into its own memory, at a socket's speed."""
        if choice.tier == "copy":
            return [a.restore_from_disk_copy.remote(choice.step, self.token) for a in actors]
        live = self.holders()
        if any(name not in live for name in choice.holders.values()):
            return []
        names = sorted(set(choice.holders.values()))
        try:  # where each serves the wire (already serving: its address, no new listener)
            served = ray.get([live[n].serve.remote(self.token) for n in names],
                             timeout=self.timeout_s)
        except Exception as exc:
            log.warning("ram_holder_address_failed", error=str(exc)[:200])
            return []
        address = {n: (str(a[0]), int(a[1])) for n, a in zip(names, served, strict=True)}
        holders = {src: (name, address[name]) for src, name in choice.holders.items()}
        return [a.restore_from_ram.remote(choice.step, choice.incarnation, holders, self.token)
                for a in actors]

    def restored(self, outs: list[dict], choice: TierChoice) -> Restored | str:
        """The group's restore, or why a host refused its copies (then the group restores from
        Orbax in place: the RAM restore ran no collective, so nothing is half-done)."""
        refused = [f"host {i}: {o['reason']}" for i, o in enumerate(outs) if not o["ok"]]
        if refused:
            log.warning("ram_restore_refused", step=choice.step, tier=choice.tier,
                        hosts=refused)
            return f"{choice.tier} step {choice.step} refused ({'; '.join(refused)[:500]})"
        assert choice.step is not None
        log.info("ram_restore_parts", step=choice.step, tier=choice.tier,
                 hosts=[{"nbytes": o.get("nbytes"), **(o.get("parts_s") or {})} for o in outs])
        return Restored(restored_step=choice.step, step=choice.step,
                        restore_s=max(float(o["restore_s"]) for o in outs), tier=choice.tier,
                        tier_reason=choice.reason,
                        nbytes=choice.nbytes or int(outs[0].get("nbytes", 0)),
                        data=outs[0].get("data"))

    def after_chunk(self, incarnation: int, records: Sequence[dict]) -> None:
        """Count ``incarnation``'s periodic copies (host 0's records); once there are two (each
        waits for the one before it to be delivered, on every host, so the first is everywhere)
        the copies of earlier incarnations can restore nothing newer: ``drop_older``, once."""
        if incarnation <= self._dropped_below:
            return
        seen = self._copies_seen.get(incarnation, 0) + sum(1 for r in records
                                                           if r.get("ram_copy_s"))
        self._copies_seen = {incarnation: seen}
        if seen >= 2:
            self._dropped_below = incarnation
            self.drop_older(incarnation)

    def drop_older(self, incarnation: int) -> None:
        """Have every holder forget the copies of incarnations before ``incarnation`` (sent,
        not waited for: the holders answer it between copies). Never raises: the tier is an
        optimisation."""
        try:
            for h in self.holders().values():
                h.drop_older.remote(self.token, int(incarnation))
            log.info("ram_older_copies_dropped", below_incarnation=incarnation)
        except Exception as exc:
            log.warning("ram_drop_older_failed", error=str(exc)[:300])

    def stats(self) -> dict[str, dict]:
        """Bytes and copies each holder keeps now (for the summary)."""
        out: dict[str, dict] = {}
        for name, h in self.holders().items():
            try:
                out[name.removeprefix(self.prefix)] = ray.get(h.stats.remote(self.token),
                                                              timeout=self.timeout_s)
            except Exception as exc:
                log.warning("ram_holder_stats_failed", holder=name, error=str(exc)[:200])
        return out

    def flush(self, *, flush_s: float = 60.0) -> dict[str, Any]:
        """Wait (bounded by ``flush_s``) until every holder's queued durable saves are done; the
        handles waited on, by name."""
        handles = self.holders()
        flushed = {name: h.flush.remote(self.token, flush_s) for name, h in handles.items()}
        ray.wait(list(flushed.values()), num_returns=len(flushed), timeout=flush_s + 5)
        return handles

    def release(self, *, flush_s: float = 60.0) -> int:
        """Kill every holder of this run once its queued durable saves are done (bounded by
        ``flush_s``), and whatever else lives under its holder names (a killed actor is handed
        nothing); returns how many."""
        n = 0
        self.flush(flush_s=flush_s)
        for name, h in self._named().items():
            try:
                ray.kill(h, no_restart=True)
                n += 1
            except Exception as exc:
                log.warning("ram_holder_kill_failed", holder=name, error=str(exc)[:200])
        return n
