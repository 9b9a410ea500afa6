"""Config validation: each bad value names its dotted setting and a fix; overrides, YAML."""

from __future__ import annotations

import pytest

from orchestrator.config import RunConfig, load_config
from orchestrator.shared.errors import ConfigError


def _error(overrides: list[str], path: str | None = None) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return info.value


def test_defaults_validate_for_the_embedded_cluster():
    """The embedded default (1 slice x 2 hosts x 2 devices) is a valid run: fsdp fills 4 devices."""
    cfg = load_config(None, [])
    shape = cfg.validate_for(slices=1, hosts_per_slice=2, devices_per_host=2)
    assert shape.as_dict() == {"data": 1, "fsdp": 4, "tensor": 1, "dcn_data": 1, "dcn_fsdp": 1}


def test_dotted_overrides_reach_nested_sections():
    """`model.num_layers=4 mesh.ici.fsdp=2` set exactly those fields, typed."""
    cfg = load_config(None, ["model.num_layers=4", "mesh.ici.fsdp=2", "mesh.ici.data=2",
                             "train.learning_rate=1e-3", "checkpoint.async_save=false"])
    assert cfg.model.num_layers == 4
    assert (cfg.mesh.ici.data, cfg.mesh.ici.fsdp, cfg.mesh.ici.tensor) == (2, 2, 1)
    assert cfg.train.learning_rate == pytest.approx(1e-3)
    assert cfg.checkpoint.async_save is False
    assert cfg.model.d_model == RunConfig().model.d_model


def test_yaml_file_then_overrides_win(tmp_path):
    """A YAML file sets values; CLI overrides take precedence over the file."""
    path = tmp_path / "run.yaml"
    path.write_text("model:\n  num_layers: 3\n  d_model: 32\ntrain:\n  global_batch: 8\n")
    cfg = load_config(str(path), ["model.num_layers=5"])
    assert (cfg.model.num_layers, cfg.model.d_model, cfg.train.global_batch) == (5, 32, 8)


@pytest.mark.parametrize(("content", "needle"), [
    ("model: [1, 2\n", "not valid YAML"),
    ("- a\n- b\n", "mapping at the top level"),
])
def test_bad_yaml_file_names_the_file(tmp_path, content, needle):
    path = tmp_path / "bad.yaml"
    path.write_text(content)
    err = _error([], str(path))
    assert err.setting == "--config"
    assert needle in str(err) and str(path) in str(err)
    assert err.fix


def test_missing_yaml_file(tmp_path):
    err = _error([], str(tmp_path / "nope.yaml"))
    assert err.setting == "--config" and "does not exist" in str(err)


@pytest.mark.parametrize(("override", "setting"), [
    ("model.bogus=1", "model.bogus"),
    ("modle.num_layers=2", "modle"),
    ("mesh.ici.pipeline=2", "mesh.ici.pipeline"),
])
def test_unknown_keys_are_rejected_with_the_known_ones(override, setting):
    """A typo is an error listing the valid keys, never silently ignored."""
    err = _error([override])
    assert err.setting == setting
    assert "unknown setting" in err.message
    assert "remove it or use one of" in err.fix


def test_unknown_key_lists_valid_siblings():
    err = _error(["model.layers=4"])
    assert "model.num_layers" in err.fix and "model.d_model" in err.fix


@pytest.mark.parametrize(("override", "setting"), [
    ("model.num_layers=0", "model.num_layers"),
    ("model.d_model=-8", "model.d_model"),
    ("model.num_heads=3", "model.num_heads"),
    ("model.num_layers=two", "model.num_layers"),
    ("model.dtype=float16", "model.dtype"),
    ("train.global_batch=0", "train.global_batch"),
    ("train.learning_rate=-1", "train.learning_rate"),
    ("train.end_lr_ratio=2", "train.end_lr_ratio"),
    ("run.total_steps=0", "run.total_steps"),
    ("run.name=has space", "run.name"),
    ("mesh.ici.fsdp=0", "mesh.ici.fsdp"),
    ("mesh.dcn.data=-2", "mesh.dcn.data"),
    ("timeouts.init_s=0", "timeouts.init_s"),
    ("checkpoint.keep=0", "checkpoint.keep"),
    ("checkpoint.async_save=maybe", "checkpoint.async_save"),
    ("cluster.connect_timeout_s=0", "cluster.connect_timeout_s"),
    ("cluster.mode=gpu", "cluster.mode"),
    ("cluster.emulate.devices_per_host=0", "cluster.emulate.devices_per_host"),
])
def test_invalid_values_name_setting_and_fix(override, setting):
    err = _error([override])
    assert err.setting == setting
    assert err.fix, "every error must say how to fix it"
    assert setting in str(err) and "Fix:" in str(err)


def test_two_fill_axes_rejected():
    err = _error(["mesh.ici.data=-1", "mesh.ici.fsdp=-1"])
    assert err.setting == "mesh.ici" and "at most one" in err.fix


def test_mesh_axes_must_multiply_to_the_device_count():
    """4 devices per slice (2 hosts x 2): data=2 x fsdp=3 cannot fit."""
    err = _error(["mesh.ici.data=2", "mesh.ici.fsdp=3"])
    assert err.setting == "mesh.ici"
    assert "multiply to 6" in err.message and "4 devices per slice" in err.message
    assert "multiply to 4" in err.fix


def test_fill_axis_must_divide_the_device_count():
    """data=3 leaves no whole fsdp size for 4 devices; the error names the axis that fills."""
    err = _error(["mesh.ici.data=3"])
    assert err.setting == "mesh.ici.fsdp"
    assert "divisor of 4" in err.fix


def test_mesh_checked_against_the_emulated_topology():
    """The same mesh is fine on 8 devices but not on 4."""
    ok = load_config(None, ["mesh.ici.data=2", "mesh.ici.fsdp=4",
                            "cluster.emulate.devices_per_host=4"])
    assert ok.mesh.resolve(slices=1, devices_per_slice=8).shape == (2, 4, 1)
    with pytest.raises(ConfigError):
        load_config(None, ["mesh.ici.data=2", "mesh.ici.fsdp=4"])


def test_batch_must_divide_by_data_parallel_size():
    """global_batch=6 over data x fsdp = 4 ways is rejected, naming the batch and a multiple."""
    err = _error(["train.global_batch=6"])
    assert err.setting == "train.global_batch"
    assert "data-parallel size 4" in err.message
    assert "multiple of 4" in err.fix


def test_batch_must_divide_by_host_count():
    """With tensor=4 the data-parallel size is 1, yet 3 rows cannot split over 2 hosts."""
    err = _error(["train.global_batch=3", "mesh.ici.tensor=4", "mesh.ici.fsdp=1",
                  "model.num_heads=4"])
    assert err.setting == "train.global_batch"
    assert "host count 2" in err.message and "multiple of 2" in err.fix


def test_tensor_axis_must_divide_heads():
    err = _error(["mesh.ici.tensor=4", "mesh.ici.fsdp=1", "model.num_heads=2", "model.d_model=64"])
    assert err.setting == "mesh.ici.tensor"


def test_validate_for_other_topologies():
    """2 slices x 2 hosts x 2 devices: DCN data fills the 2 slices, ICI fsdp the 4 devices."""
    cfg = RunConfig()
    shape = cfg.validate_for(slices=2, hosts_per_slice=2, devices_per_host=2)
    assert (shape.dcn_data, shape.ici_fsdp, shape.shape) == (2, 4, (2, 4, 1))
    with pytest.raises(ConfigError) as info:
        load_config(None, ["train.global_batch=12"]).validate_for(
            slices=2, hosts_per_slice=2, devices_per_host=2)
    assert info.value.setting == "train.global_batch"


def test_malformed_override():
    err = _error(["model.num_layers"])
    assert "dotted.key=value" in err.fix


def test_override_into_a_value_is_rejected():
    err = _error(["model.num_layers.x=1"])
    assert err.setting == "model.num_layers"


def test_errors_survive_pickling():
    """Errors cross actor boundaries: setting and fix must survive a pickle round trip."""
    import pickle

    err = _error(["model.num_layers=0"])
    back = pickle.loads(pickle.dumps(err))
    assert (type(back), back.setting, back.fix, str(back)) == (ConfigError, err.setting, err.fix,
                                                                 str(err))
