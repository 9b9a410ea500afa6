"""The ``task`` section (pure data, no JAX): a kind is ``lm`` or ``module:function``; the task's
settings sit beside it (or under ``settings``, the resolved config's form); the built-in lm task
keeps ``model.*``; the fingerprint decides which checkpoints fit; hosts get plain data."""

from __future__ import annotations

import pickle

import pytest
import yaml

from orchestrator.config import ModelConfig, load_config
from orchestrator.shared import configtools
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import MeshPlan
from orchestrator.shared.task import task_fingerprint, task_ref

USER = "task.kind=my_pkg.tasks:make_task"


@pytest.mark.parametrize("kind", ["foo", "my_pkg.tasks", "my_pkg.tasks:", ":make", "a-b:c",
                                  "my_pkg.class:make", "a.b:c.d"])
def test_a_kind_that_is_not_module_function_is_refused(kind):
    with pytest.raises(ConfigError) as info:
        load_config(None, [f"task.kind={kind}"])
    assert info.value.setting == "task.kind"
    assert "package.module:function" in info.value.fix


def test_settings_beside_the_kind_or_under_settings_and_never_both():
    inline = load_config(None, [USER, "task.hidden=8", "task.depth=2"])
    nested = load_config(None, [USER, "task.settings.hidden=8", "task.settings.depth=2"])
    assert inline.task == nested.task
    assert task_ref(inline).settings == {"hidden": 8, "depth": 2}
    with pytest.raises(ConfigError) as info:
        load_config(None, [USER, "task.hidden=8", "task.settings.hidden=9"])
    assert info.value.setting == "task.hidden"


def test_the_resolved_config_reloads_to_the_same_config(tmp_path):
    for overrides in ([USER, "task.hidden=8"], ["task.num_layers=3"], ["model.num_layers=3"]):
        cfg = load_config(None, overrides)
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(configtools.to_dict(cfg)))
        assert load_config(str(path)) == cfg


def test_lm_keeps_model_and_takes_task_settings_in_one_place():
    assert load_config(None, ["task.num_layers=3"]).model == ModelConfig(num_layers=3)
    assert load_config(None, ["model.num_layers=3"]).model == ModelConfig(num_layers=3)
    same = load_config(None, ["task.num_layers=3", "model.num_layers=3"])
    assert same.model == ModelConfig(num_layers=3)
    with pytest.raises(ConfigError, match="given twice"):
        load_config(None, ["task.num_layers=3", "model.num_layers=4"])
    with pytest.raises(ConfigError) as info:
        load_config(None, ["task.num_layer=3"])
    assert info.value.setting == "task.num_layer" and "task.num_layers" in info.value.fix
    with pytest.raises(ConfigError) as info:
        load_config(None, [USER, "model.num_layers=4"])
    assert info.value.setting == "model" and "task.<name>" in info.value.fix


def test_fingerprints_keep_lm_checkpoints_and_tell_tasks_apart():
    m = ModelConfig(d_model=32)
    assert m.fingerprint() == task_fingerprint("lm", configtools.to_dict(m))
    a = task_fingerprint("my_pkg.tasks:make_task", {"hidden": 8})
    assert a != task_fingerprint("my_pkg.other:make_task", {"hidden": 8})
    assert a != task_fingerprint("my_pkg.tasks:make_task", {"hidden": 9})
    assert a != task_fingerprint("lm", {"hidden": 8})


def test_lm_only_checks_its_heads_against_the_tensor_axis():
    with pytest.raises(ConfigError, match="num_heads"):
        load_config(None, ["model.num_heads=1", "model.d_model=3", "mesh.ici.tensor=2",
                           "mesh.ici.fsdp=2"])
    load_config(None, [USER, "mesh.ici.tensor=4", "mesh.ici.fsdp=1"])  # the task check's job


def test_hosts_get_the_task_as_plain_data():
    cfg = load_config(None, [USER, "task.hidden=8"])
    host = HostRef(index=0, slice_name="s", worker_id=0, node_id="n", node_ip="127.0.0.1",
                   instance="i", devices=4)
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=4)
    plan = MeshPlan(hosts=(host,), slice_names=("s",), shape=shape, devices_per_host=4,
                    platform="cpu")
    spec = HostSpec.for_host(cfg, plan, host, checkpoint_dir="/r/checkpoints")
    assert (spec.task.kind, spec.task.target, spec.task.settings) == (
        "my_pkg.tasks:make_task", "my_pkg.tasks:make_task", {"hidden": 8})
    assert pickle.loads(pickle.dumps(spec)) == spec
    lm = HostSpec.for_host(load_config(None, ["model.d_ff=8"]), plan, host,
                           checkpoint_dir="/r/checkpoints")
    assert (lm.task.target, lm.task.settings["d_ff"]) == ("workers.task.lm:make_task", 8)
