"""HostSpec: what one host needs, built from the driver's config; CheckpointCorrupt crosses
process boundaries intact."""

from __future__ import annotations

import dataclasses
import pickle

import pytest

from orchestrator.config import load_config
from orchestrator.shared.errors import CheckpointCorrupt, CheckpointError, ConfigError
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh


def _hosts(n: int) -> list[HostRef]:
    return [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip="10.0.0.1",
                    instance=f"vm-{i}", devices=2) for i in range(n)]


def _plan(cfg):
    return plan_mesh(cfg, _hosts(2), platform="cpu")


def test_for_host_copies_what_a_host_needs():
    cfg = load_config(None, ["run.seed=7", "run.total_steps=50", "timeouts.init_s=33",
                             "timeouts.heartbeat_s=9", "checkpoint.keep=2"])
    plan = _plan(cfg)
    spec = HostSpec.for_host(cfg, plan, plan.hosts[1], checkpoint_dir="/r/checkpoints",
                             accum_steps=2)
    assert (spec.host, spec.plan, spec.train, spec.checkpoint) == (
        plan.hosts[1], plan, cfg.train, cfg.checkpoint)
    assert (spec.task.kind, spec.task.target) == ("lm", "workers.task.lm:make_task")
    assert spec.task.settings == dataclasses.asdict(cfg.model), "lm's settings: model.*"
    assert (spec.seed, spec.total_steps, spec.accum_steps, spec.init_timeout_s,
            spec.heartbeat_s, spec.checkpoint_dir) == (7, 50, 2, 33.0, 9.0, "/r/checkpoints")
    assert spec.config_digest == cfg.digest()
    assert spec.process_id == 1
    assert pickle.loads(pickle.dumps(spec)) == spec


def test_accum_steps_must_divide_the_batch():
    cfg = load_config(None, ["train.global_batch=16"])
    plan = _plan(cfg)
    with pytest.raises(ConfigError) as info:
        HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/c", accum_steps=3)
    assert info.value.setting == "train.global_batch"
    assert "multiple of 3" in info.value.fix


def test_host_outside_the_plan_is_refused():
    cfg = load_config(None, [])
    plan = _plan(cfg)
    stranger = _hosts(3)[2]
    with pytest.raises(ValueError, match="not in the mesh plan"):
        HostSpec.for_host(cfg, plan, stranger, checkpoint_dir="/c")


def test_checkpoint_corrupt_is_a_non_retryable_checkpoint_error_that_pickles():
    err = CheckpointCorrupt(step=40, reason="truncated shard", hosts=(1,))
    back = pickle.loads(pickle.dumps(err))
    assert isinstance(back, CheckpointError) and not back.retryable
    assert (back.step, back.reason, back.hosts) == (40, "truncated shard", (1,))
    assert "skip_steps" in back.fix and "40" in back.message
