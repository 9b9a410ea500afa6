"""The Ray side of the seam maps what it sees into typed statuses (pure parts, no cluster)."""

from __future__ import annotations

from orchestrator.controller.seam import HostsLost, Progress
from orchestrator.raygroup.results import combine, lost_kind
from orchestrator.shared.hosts import HostRef
from policies.causes import FailureKind


def test_hosts_disagreeing_on_the_step_become_a_recovery_not_a_crash():
    status = combine([{"step": 10, "records": []}, {"step": 9, "records": []}])
    assert isinstance(status, HostsLost)
    assert status.kind is FailureKind.STEP_ERROR and status.step_reached == 10


def test_a_step_is_committed_only_when_every_host_committed_it():
    status = combine([{"step": 10, "committed_step": 10, "records": [{"step": 10}]},
                      {"step": 10, "committed_step": 5, "records": []}])
    assert isinstance(status, Progress)
    assert status.committed_step == 5 and status.records == ({"step": 10},)
    none_yet = combine([{"step": 3, "committed_step": None}, {"step": 3, "committed_step": 0}])
    assert none_yet.committed_step is None


def _hosts(*slices: str) -> list[HostRef]:
    return [HostRef(slice_name=s, worker_id=w, node_id=f"{s}-n{w}", node_ip="10.0.0.1",
                    instance=f"{s}-w{w}", index=i, devices=4)
            for i, (s, w) in enumerate((s, w) for s in slices for w in range(2))]


def test_dead_nodes_refine_the_failure_kind():
    hosts = _hosts("a", "b")
    assert lost_kind(FailureKind.ACTOR_DIED, set(), hosts) is FailureKind.ACTOR_DIED
    assert lost_kind(FailureKind.ACTOR_UNAVAILABLE, {"a-n1"}, hosts) is FailureKind.NODE_DIED
    assert lost_kind(FailureKind.ACTOR_DIED, {"a-n0", "a-n1"}, hosts) is FailureKind.SLICE_LOST


def test_a_full_disk_is_a_storage_fault_with_its_own_fix_not_an_application_error():
    """ENOSPC / EDQUOT, raised as itself, chained under Orbax's error, or only in the text of
    Ray's task error, stops the run naming the fix (free space), never a retry loop."""
    import errno

    from ray.exceptions import RayTaskError

    from orchestrator.raygroup.results import storage_fault, storage_message

    enospc = OSError(errno.ENOSPC, "No space left on device", "/ckpt/150/d/x")
    assert "no space left" in storage_fault(enospc)
    try:
        try:
            raise OSError(errno.EDQUOT, "Disk quota exceeded")
        except OSError as inner:
            raise ValueError("orbax: save failed") from inner
    except ValueError as wrapped:
        assert "quota" in storage_fault(wrapped)
    text_only = RayTaskError("HostActor.save", "Traceback ...\nOSError: [Errno 28] No space "
                             "left on device: '/ckpt/150'\n", RuntimeError("save failed"))
    assert "[Errno 28]" in storage_fault(text_only)
    assert storage_fault(RuntimeError("step failed: NaN loss")) is None
    assert storage_fault(OSError(errno.EACCES, "Permission denied")) is None
    assert "free space" in storage_message("x") and "budget" not in storage_message("x")


def test_the_ray_group_maps_a_full_disk_to_a_fatal_status():
    import errno

    from orchestrator.controller.seam import Fatal
    from orchestrator.raygroup.group import RayWorkerGroup

    group = object.__new__(RayWorkerGroup)
    status = group._failure(OSError(errno.ENOSPC, "No space left on device"), (1,))
    assert isinstance(status, Fatal) and "free space" in status.message and status.hosts == (1,)


GLOO_GAVE_UP = ("host(s) [0]: XlaRuntimeError: INTERNAL: Gloo context initialization failed: "
                "DEADLINE_EXCEEDED: Deadline Exceeded ... waited 29.99 s")


def test_a_peers_collective_timing_out_names_the_host_still_in_its_step_hung():
    """Issue 51 (the soak, seed 50): a host hung in a fresh group's first step; its peers'
    Gloo context gave up (30 s) before the driver's step bound, and their error was charged
    to application_error (2 restarts by default). It is the silent host's hang now."""
    import time

    from orchestrator.controller.seam import Hung
    from orchestrator.raygroup.group import RayWorkerGroup

    group = object.__new__(RayWorkerGroup)
    group._refs, group._results, group._chunk_t0 = ["r0", "r1", "r2"], {}, time.monotonic()
    group.name_hung = lambda status: status  # the whereabouts probe needs live actors
    err = HostsLost(hosts=(0,), kind=FailureKind.STEP_ERROR, message=GLOO_GAVE_UP)
    hung = group._peer_hung(err, ready=["r0", "r2"])
    assert isinstance(hung, Hung) and hung.phase == "step" and hung.hosts == (1,)
    assert "did not answer their peers' collective" in hung.message
    # a plain step error, or one with no host left in its step, stays the application's
    plain = HostsLost(hosts=(0,), kind=FailureKind.STEP_ERROR, message="ValueError: nan")
    assert group._peer_hung(plain, ready=["r0"]) is plain
    assert group._peer_hung(err, ready=["r0", "r1", "r2"]) is err
