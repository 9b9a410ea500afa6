"""The executable store (workers/training/executables.py): keys, fallbacks, and a real round trip.

Pure tests of the key and of the store's refusals need no JAX. The JAX parts run in subprocesses
(``exec_scenarios``): one process with 4 CPU devices (load, corrupt file, other key, store off,
unwritable store), and distributed groups of 2 processes (gloo, 2 CPU devices each): one compiling
for the group, a NEW group of the same shape loading, per-process files without sharing; losses
bit-identical throughout. Signatures: tests/security/test_executables_boundary.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrator.config import CompileConfig, load_config
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.host_env import DIR_NAME, key_path
from orchestrator.shared.hosts import HostRef
from orchestrator.shared.hostspec import HostSpec
from orchestrator.shared.plan import plan_mesh
from tests.production.test_run_dir_contract import run_dir_rows
from workers.training.exec_auth import load_key
from workers.training.executables import (
    MAGIC,
    ExecutableStore,
    encode,
    executable_key,
    file_name,
    key_differences,
    key_digest,
    read_header,
)

REPO = Path(__file__).resolve().parents[2]


# ---- the key (pure) -----------------------------------------------------------------------------

def _base() -> dict:
    return dict(
        function="train_step",
        runtime={"jax": "0.10.2", "jaxlib": "0.10.2", "libraries": {"flax": "0.12",
                                                                    "optax": "0.2"},
                 "platform": "cpu", "platform_version": "cpu", "device_kind": "cpu",
                 "xla_flags": "--xla_force_host_platform_device_count=2",
                 "libtpu_init_args": "", "code": "c0",
                 "options": {"jax_enable_x64": False, "jax_default_matmul_precision": None}},
        config={"model": {"d_model": 64, "num_layers": 2}, "train": {"learning_rate": 3e-3},
                "total_steps": 200, "accum_steps": 1},
        mesh={"axes": ["data", "fsdp", "tensor"], "shape": [1, 4, 1],
              "plan": {"data": 1, "fsdp": 4, "tensor": 1}, "num_slices": 1,
              "devices": [[0, 0, [], None], [1, 0, [], None], [2, 1, [], None],
                          [3, 1, [], None]]},
        process_index=0, process_count=2)


def _changed(path: str, value) -> dict:
    kw = json.loads(json.dumps(_base()))
    *parents, leaf = path.split(".")
    d = kw
    for p in parents:
        d = d[p]
    d[leaf] = value
    return kw


CHANGES = {
    "runtime.jax": "0.10.3",
    "runtime.jaxlib": "0.10.3",
    "runtime.libraries.flax": "0.13",
    "runtime.xla_flags": "--xla_force_host_platform_device_count=4",
    "runtime.libtpu_init_args": "--xla_tpu_enable_latency_hiding_scheduler=true",
    "runtime.platform": "tpu",
    "runtime.device_kind": "TPU v5 lite",
    "runtime.options.jax_enable_x64": True,
    "runtime.options.jax_default_matmul_precision": "highest",
    "runtime.code": "c1",
    "config.model.d_model": 128,
    "config.train.learning_rate": 1e-3,
    "config.total_steps": 400,
    "config.accum_steps": 2,
    "mesh.shape": [2, 2, 1],
    "mesh.num_slices": 2,
    "mesh.devices": [[1, 0, [], None], [0, 0, [], None], [2, 1, [], None], [3, 1, [], None]],
    "process_index": 1,
    "process_count": 4,
    "function": "init",
}


@pytest.mark.parametrize("path", sorted(CHANGES))
def test_every_ingredient_changes_the_key_and_the_file(path):
    base = executable_key(**_base())
    other = executable_key(**_changed(path, CHANGES[path]))
    assert key_digest(other) != key_digest(base)
    assert file_name(other) != file_name(base)
    diff = key_differences(base, other)
    assert diff and all(path.split(".")[-1] in d or "process" in d for d in diff), diff


def test_digest_is_stable_and_ignores_dict_order():
    a = executable_key(**_base())
    kw = _base()
    kw["config"] = dict(reversed(list(kw["config"].items())))
    assert key_digest(executable_key(**kw)) == key_digest(a)
    assert key_digest(a) == key_digest(json.loads(json.dumps(a)))
    assert file_name(a) == f"train_step.{key_digest(a)}.p0-of-2.xla"


def test_key_refuses_a_bad_function_name_or_process_index():
    with pytest.raises(ValueError, match="function name"):
        executable_key(**{**_base(), "function": "../x"})
    with pytest.raises(ValueError, match=r"outside 0\.\.1"):
        executable_key(**{**_base(), "process_index": 2})


def test_differences_name_the_ingredient_and_are_bounded():
    base = executable_key(**_base())
    other = executable_key(**_changed("runtime.jax", "0.11.0"))
    assert key_differences(base, other) == ['runtime.jax: "0.10.2" -> "0.11.0"']
    many = executable_key(**{**_base(), "runtime": {f"k{i}": i for i in range(9)}})
    got = key_differences(base, many, limit=3)
    assert len(got) == 4 and got[-1].startswith("... ")


# ---- the store's refusals (no JAX: they fail before an executable is read) ----------------------

def _write(path: Path, key: dict, body: bytes = b"x") -> None:
    """A file as the store writes it, signed with the suite's key (conftest)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(encode(load_key(key_path()), {"key": key}, body))


def test_nothing_stored_says_so(tmp_path):
    got = ExecutableStore(tmp_path / "none").load(executable_key(**_base()), args=())
    assert got.compiled is None and got.reason == "no executable stored for this key yet"


def test_a_stale_file_of_the_same_process_names_what_changed(tmp_path):
    store = ExecutableStore(tmp_path)
    old = executable_key(**_changed("runtime.jaxlib", "0.10.1"))
    _write(store.path(old), old)
    got = store.load(executable_key(**_base()), args=())
    assert got.compiled is None
    assert got.reason.startswith(f"key changed since {file_name(old)}")
    assert 'runtime.jaxlib: "0.10.1" -> "0.10.2"' in got.reason


def test_another_process_file_is_not_a_reason(tmp_path):
    store = ExecutableStore(tmp_path)
    other = executable_key(**_changed("process_index", 1))
    _write(store.path(other), other)
    got = store.load(executable_key(**_base()), args=())
    assert got.reason == "no executable stored for this key yet"


@pytest.mark.parametrize("damage", ["empty", "magic", "header", "body", "key"])
def test_a_damaged_file_is_refused_with_the_reason(tmp_path, damage):
    store = ExecutableStore(tmp_path)
    key = executable_key(**_base())
    path = store.path(key)
    _write(path, key, b"payload")
    data = path.read_bytes()
    if damage == "empty":
        path.write_bytes(b"")
    elif damage == "magic":
        path.write_bytes(b"X" + data[1:])
    elif damage == "header":
        path.write_bytes(MAGIC + data[len(MAGIC):len(MAGIC) + 65] + b"{broken")
    elif damage == "body":
        path.write_bytes(data[:-1] + b"Q")
    else:
        _write(path, executable_key(**_changed("runtime.code", "zz")), b"payload")
    got = store.load(key, args=())
    assert got.compiled is None
    if damage == "key":
        assert "holds another key" in got.reason and "runtime.code" in got.reason
    else:
        assert got.reason.startswith(f"{path.name} is unreadable (ValueError")
    if damage == "body":
        assert "checksum mismatch" in got.reason


def test_read_header_gives_the_key_without_loading(tmp_path):
    key = executable_key(**_base())
    _write(tmp_path / "f.xla", key)
    assert read_header(tmp_path / "f.xla")["key"] == key


# ---- config and spec ----------------------------------------------------------------------------

def test_compile_cache_is_on_by_default_and_validated():
    assert load_config(None, []).compile.cache == "on"
    assert load_config(None, ["compile.cache=off"]).compile.cache == "off"
    with pytest.raises(ConfigError) as info:
        load_config(None, ["compile.cache=sometimes"])
    assert info.value.setting == "compile.cache"
    with pytest.raises(ConfigError, match=r"compile\.cache=on"):
        CompileConfig(cache="yes")  # type: ignore[arg-type]


@pytest.mark.parametrize("cache,expected", [("on", "/r/executables"), ("off", None)])
def test_spec_carries_the_store_only_when_the_cache_is_on(cache, expected):
    cfg = load_config(None, [f"compile.cache={cache}"])
    hosts = [HostRef(index=i, slice_name="s", worker_id=i, node_id=f"n{i}", node_ip="10.0.0.1",
                     instance=f"vm-{i}", devices=2) for i in range(2)]
    plan = plan_mesh(cfg, hosts, platform="cpu")
    spec = HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/r/checkpoints",
                             executables_dir="/r/executables")
    assert (spec.executables_dir, spec.executables_key) == (expected, expected and key_path())
    bare = HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/r/checkpoints")
    assert bare.executables_dir is None and bare.executables_key is None


def test_store_dir_setting_then_environment_then_run_dir():
    from orchestrator.shared.host_env import ENV_DIR, store_dir

    assert store_dir("/team/exe", "/r", {ENV_DIR: "/env/exe"}) == "/team/exe"
    assert store_dir("", "/r", {ENV_DIR: "/env/exe"}) == "/env/exe"
    assert store_dir("", "/r", {}) == f"/r/{DIR_NAME}"
    with pytest.raises(ConfigError, match="absolute") as info:
        load_config(None, ["compile.dir=exe"])
    assert info.value.setting == "compile.dir"


def test_run_directory_table_has_the_store():
    row = run_dir_rows()[DIR_NAME]
    assert "compile.cache" in row and "p<index>-of-<count>" in row


# ---- real JAX, one process with 4 devices -------------------------------------------------------

@pytest.fixture(scope="module")
def seen(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("exec") / "scenarios.json"
    proc = subprocess.run([sys.executable, "-m", "tests.workers.exec_scenarios", "single",
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def scenario(seen: dict, name: str) -> dict:
    got = seen[name]
    assert "error" not in got, got.get("error")
    return got


def test_second_actor_loads_step_and_init_and_trains_identically(seen):
    got = scenario(seen, "roundtrip")
    first, second = got["first"]["compile"], got["second"]["compile"]
    assert (first["source"], first["init"]["source"]) == ("compiled", "compiled")
    assert first["reason"] == "no executable stored for this key yet"
    assert first["save_s"] is not None
    assert (second["source"], second["init"]["source"]) == ("loaded", "loaded")
    assert (second["key"], second["reason"]) == (first["key"], "")
    assert second["flops_xla"] == first["flops_xla"] and first["flops_xla"]
    assert got["second"]["losses"] == got["first"]["losses"]
    assert got["files"] == got["files_after"] == sorted([
        f"init.{first['init']['key']}.p0-of-1.xla", f"train_step.{first['key']}.p0-of-1.xla"])


def test_corrupt_file_falls_back_to_compiling_and_is_rewritten(seen):
    got = scenario(seen, "corrupt")
    base, damaged = got["base"], got["garble_body"]
    assert damaged["compile"]["source"] == "compiled"
    assert "is unreadable" in damaged["compile"]["reason"]
    assert damaged["compile"]["key"] == base["compile"]["key"]
    assert damaged["losses"] == base["losses"]
    assert damaged["again"]["source"] == "loaded"


def test_other_config_compiles_and_says_which_ingredient_changed(seen):
    got = scenario(seen, "mismatch")
    other = got["other"]["compile"]
    assert other["source"] == "compiled" and other["key"] != got["base"]["compile"]["key"]
    assert other["reason"].startswith("key changed since train_step.")
    assert "config.train.learning_rate: 0.003 -> 0.001" in other["reason"]
    assert other["init"]["source"] == "compiled"
    assert got["other"]["losses"] != got["base"]["losses"]


def test_file_under_the_right_name_with_another_key_is_refused(seen):
    planted = scenario(seen, "mismatch")["planted"]
    assert planted["source"] == "compiled"
    assert "holds another key" in planted["reason"]
    assert "config.task.settings.seq_len: 16 -> 8" in planted["reason"]


def test_stored_step_asked_for_other_arguments_is_refused(seen):
    probe = scenario(seen, "mismatch")["probe"]
    assert probe["same"] == ""
    assert probe["shapes"].endswith("was compiled for other argument shapes or dtypes")
    assert probe["tree"].endswith("was compiled for another argument tree")


def test_store_off_compiles_every_time_and_writes_nothing(seen):
    got = scenario(seen, "off")
    c = got["first"]["compile"]
    assert (c["source"], c["key"], c["save_s"]) == ("compiled", None, None)
    assert c["reason"] == "executable store off (compile.cache=off)"
    assert got["exists"] is False


def test_unwritable_store_still_trains(seen):
    got = scenario(seen, "unwritable")
    c = got["first"]["compile"]
    assert c["source"] == "compiled" and c["save_s"] is None
    assert len(got["first"]["losses"]) == 3 and got["in_the_way"] == "in the way"


# ---- real JAX, two distributed groups of 2 processes --------------------------------------------

def _group(run_dir: Path, tmp: Path, name: str, *overrides: str) -> list[dict]:
    from orchestrator.shared.host_env import free_port

    coordinator = f"127.0.0.1:{free_port()}"
    procs, outs = [], []
    for i in range(2):
        out = tmp / f"{name}-{i}.json"
        outs.append(out)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.workers.exec_scenarios", "member", "--process-id",
             str(i), "--num-processes", "2", "--coordinator", coordinator, "--run-dir",
             str(run_dir), "--out", str(out), *(f"--override={o}" for o in overrides)],
            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    try:
        errs = [p.communicate(timeout=600)[1] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    results = []
    for p, out, err in zip(procs, outs, errs, strict=True):
        assert p.returncode == 0 and out.exists(), err[-3000:]
        got = json.loads(out.read_text())
        assert "error" not in got, got["error"]
        results.append(got)
    return results


def _sources(r: dict) -> tuple[str, str]:
    return r["compile"]["source"], r["compile"]["init"]["source"]


def test_new_group_of_the_same_shape_loads_and_matches_bit_for_bit(tmp_path):
    """The re-form case with a shared compile (the default here): in group 1 process 0 compiles
    and stores one file per function and process 1 loads it; a NEW group (new processes, new
    distributed runtime) loads them on both processes; losses are bit-identical throughout."""
    run_dir = tmp_path / "run"
    first = _group(run_dir, tmp_path, "first")
    second = _group(run_dir, tmp_path, "second")
    assert [_sources(r) for r in first] == [("compiled", "compiled"), ("loaded", "loaded")]
    assert [_sources(r) for r in second] == [("loaded", "loaded")] * 2
    for i in range(2):
        assert second[i]["compile"]["key"] == first[i]["compile"]["key"] == \
            first[0]["compile"]["key"]  # one key for the group
        assert second[i]["losses"] == first[i]["losses"] == first[0]["losses"]
        assert len(first[i]["losses"]) == 3
    names = sorted(p.name for p in (run_dir / DIR_NAME).iterdir())
    assert names == sorted([f"train_step.{first[0]['compile']['key']}.p0-of-2.xla",
                            f"init.{first[0]['compile']['init']['key']}.p0-of-2.xla"])


def test_without_sharing_every_process_compiles_and_stores_its_own(tmp_path):
    """compile.share=false: per-process keys and files; a new group loads its own file on each
    process, bit-identical to the shared compile's losses."""
    run_dir = tmp_path / "run"
    first = _group(run_dir, tmp_path, "first", "compile.share=false")
    second = _group(run_dir, tmp_path, "second", "compile.share=false")
    assert [_sources(r) for r in first] == [("compiled", "compiled")] * 2
    assert [_sources(r) for r in second] == [("loaded", "loaded")] * 2
    assert first[0]["compile"]["key"] != first[1]["compile"]["key"]  # per-process keys
    for i in range(2):
        assert second[i]["compile"]["key"] == first[i]["compile"]["key"]
        assert second[i]["losses"] == first[i]["losses"]
    shared = _group(tmp_path / "shared", tmp_path, "shared")
    assert shared[1]["losses"] == first[1]["losses"]  # the owner's executable, the same numbers
    names = sorted(p.name for p in (run_dir / DIR_NAME).iterdir())
    assert names == sorted(f"{fn}.{c['key'] if fn == 'train_step' else c['init']['key']}"
                           f".p{i}-of-2.xla" for i, c in enumerate(r["compile"] for r in first)
                           for fn in ("train_step", "init"))


def test_owner_that_cannot_store_tells_the_others_who_compile_their_own(tmp_path):
    """The store cannot be written (its path is a file): the owner says so at once, process 1
    compiles itself instead of waiting out the bound, and the run trains the same."""
    (run_dir := tmp_path / "run").mkdir()
    (run_dir / DIR_NAME).write_text("not a directory")
    got = _group(run_dir, tmp_path, "blocked")
    assert [_sources(r) for r in got] == [("compiled", "compiled")] * 2
    for kind in (got[1]["compile"], got[1]["compile"]["init"]):
        # told (a timed-out wait would say "no word from process 0 in 90s")
        assert "process 0 did not store it (it could not be written)" in kind["reason"], kind
    assert got[0]["losses"] == got[1]["losses"]
