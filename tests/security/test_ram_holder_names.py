"""A RAM holder is found by a predictable name, and anyone on the cluster can list the names
(issue 49, lows on holders): an actor created first under a holder's name was handed the run's
token by ``serve``. Here one squats the name of the holder on one node before the driver creates
it, and answers the driver's challenge by relaying it to the run's real holder on another node;
the driver never hands it the token, never gives its address to a host, and the real holder is
still served. Real Ray (an emulated cluster of a head and one host), real holders."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import ray

from orchestrator.raygroup.ram_holders import NAMESPACE, RamTier
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.sections import RamTierConfig
from tests.support.ray_cluster import emulated_cluster
from tests.workers.ram_testing import TOKEN

pytestmark = pytest.mark.cluster


@ray.remote(num_cpus=0)
class _Squatter:
    """Every holder call, recorded; the driver's challenge relayed to the run's real holder."""

    def __init__(self, real_name: str) -> None:
        self.real_name = real_name
        self.calls: list[str] = []

    def _seen(self, method: str, *args, **kwargs) -> None:
        self.calls.append(json.dumps([method, args, kwargs], default=str))

    def prove(self, nonce):
        self._seen("prove", nonce)
        real = ray.get_actor(self.real_name, namespace=NAMESPACE)
        return ray.get(real.prove.remote(nonce))

    def serve(self, *args, **kwargs):
        self._seen("serve", *args, **kwargs)
        return ("127.0.0.1", 9)

    def inventory(self, *args, **kwargs):
        self._seen("inventory", *args, **kwargs)
        return []

    def stats(self, *args, **kwargs):
        self._seen("stats", *args, **kwargs)
        return {}

    def flush(self, *args, **kwargs):
        self._seen("flush", *args, **kwargs)
        return True

    def seen(self) -> list[str]:
        return self.calls


@ray.remote(num_cpus=0)
class _Host:
    """What a host actor's ``attach_ram`` is given."""

    def attach_ram(self, holders, **kwargs) -> list:
        return holders


def _host(index: int, node_id: str) -> HostRef:
    return HostRef(index=index, slice_name=f"s{index}", worker_id=0, node_id=node_id,
                   node_ip="127.0.0.1", instance=f"vm-{index}", devices=1)


def test_an_actor_squatting_a_holders_name_never_gets_the_token(tmp_path):
    with emulated_cluster(layout=[1], devices_per_host=1):
        squatted, real = sorted(n["NodeID"] for n in ray.nodes() if n["Alive"])
        tier = RamTier(RamTierConfig(enabled=True, every=1, durable_from_ram=False,
                                     max_host_bytes=1 << 20),
                       key="squat-test", token=TOKEN, checkpoint_dir=str(tmp_path),
                       checkpoint_keep=1, timeout_s=30.0)
        squatter = _Squatter.options(name=tier.prefix + squatted, namespace=NAMESPACE,
                                     lifetime="detached").remote(tier.prefix + real)
        ray.get(squatter.seen.remote())  # up before the driver looks for its holders
        plan = SimpleNamespace(hosts=[_host(0, squatted), _host(1, real)])
        hosts = [_Host.remote(), _Host.remote()]

        attached = ray.get(tier.attach_calls(hosts, plan, incarnation=1), timeout=60)
        found, entries, stats = tier.holders(), tier.inventory(), tier.stats()
        tier.flush(flush_s=5)
        seen = ray.get(squatter.seen.remote())
        released = tier.release(flush_s=5)

    assert seen and all(json.loads(c)[0] == "prove" for c in seen), seen
    assert TOKEN not in "".join(seen), "the squatter was handed the run's token"
    assert [[name for name, _ in mine] for mine in attached] == [[tier.prefix + real]] * 2
    assert list(found) == [tier.prefix + real]
    assert entries == [] and list(stats) == [real]
    assert released == 2  # the real holder and the squatter: nothing lives on under the names
