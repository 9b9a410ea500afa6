"""The executable store's trust boundary (issue 29, item 1): a file in the store is unpickled on
every host that loads it, and others can write the store, so nothing is unpickled unless it is
signed with the key kept outside the store and nobody else could have written it.

Every planted body here is a valid pickle whose unpickling creates a marker file: the marker is
the proof that nothing planted ever ran. No JAX compile, no Ray.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import stat
from pathlib import Path

import pytest
import yaml

from orchestrator.shared.host_env import ENV_KEY, key_path
from workers.training.exec_auth import Untrusted, load_key
from workers.training.executables import MAGIC, ExecutableStore, executable_key

REPO = Path(__file__).resolve().parents[2]


class _Plant:
    """Unpickling this creates ``marker`` (what an attacker's code would do, harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _key() -> dict:
    return executable_key(function="train_step", runtime={"jax": "0.10.2"}, config={"lr": 1},
                          mesh={"shape": [1]}, process_index=0, process_count=1)


def _store(tmp_path: Path) -> ExecutableStore:
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    os.chmod(root, 0o755)
    keys = tmp_path / "keys"
    keys.mkdir(mode=0o700)
    return ExecutableStore(root, key_file=str(keys / "executables.key"))


def _header(key: dict, body: bytes) -> bytes:
    return json.dumps({"key": key, "body_len": len(body),
                       "body_sha256": hashlib.sha256(body).hexdigest()}).encode() + b"\n"


def _plant_unsigned(path: Path, key: dict, marker: Path) -> None:
    """What anyone could write without the key: magic, header (matching key, right checksum),
    a pickled body — the layout the store trusted before files were signed."""
    body = pickle.dumps(_Plant(marker))
    path.write_bytes(MAGIC + _header(key, body) + body)


def _plant_signed(path: Path, key: dict, marker: Path, signing_key: bytes) -> None:
    """The store's own layout, MAC made with ``signing_key``."""
    from workers.training.executables import encode

    body = pickle.dumps(_Plant(marker))
    header = json.loads(_header(key, body))
    path.write_bytes(encode(signing_key, header, body))


class _Jitted:
    """Stands in for a jitted function: counts compiles; its result cannot be serialised."""

    def __init__(self) -> None:
        self.compiles = 0

    def lower(self, *args):
        return self

    def compile(self):
        self.compiles += 1
        return object()


def test_forged_unsigned_file_is_never_unpickled_and_the_step_is_compiled_afresh(tmp_path,
                                                                                  caplog):
    """A forged file under the right name with the right key and checksum: the marker is never
    created, the step is compiled, and the warning says why."""
    from workers.training.compile_share import obtain

    store, key, marker = _store(tmp_path), _key(), tmp_path / "PWNED"
    _plant_unsigned(store.path(key), key, marker)
    jitted = _Jitted()
    with caplog.at_level(logging.WARNING):
        _, info = obtain("train_step", jitted, (), store=store, key=key, devices=None)
    assert not marker.exists()
    assert (info.source, jitted.compiles) == ("compiled", 1)
    assert info.reason.startswith(f"{store.path(key).name} is unreadable")
    assert any(f"compiling train_step: {info.reason}" in r.getMessage() for r in caplog.records)


def test_file_signed_with_another_key_is_refused_before_unpickling(tmp_path, caplog):
    """The store's exact layout with a MAC under another key: refused, the reason says the
    signature does not verify and names the fix; the marker is never created."""
    from workers.training.compile_share import obtain

    store, key, marker = _store(tmp_path), _key(), tmp_path / "PWNED"
    _plant_signed(store.path(key), key, marker, os.urandom(32).hex().encode())
    jitted = _Jitted()
    with caplog.at_level(logging.WARNING):
        _, info = obtain("train_step", jitted, (), store=store, key=key, devices=None)
    assert not marker.exists()
    assert (info.source, jitted.compiles) == ("compiled", 1)
    assert "refused, compiled afresh" in info.reason
    assert "signature does not verify" in info.reason and ENV_KEY in info.reason
    assert any("signature does not verify" in r.getMessage() for r in caplog.records)


def test_group_writable_store_is_refused_even_with_a_valid_signature(tmp_path, caplog):
    """A store its group can write: nothing in it is read (a correctly signed file included)
    and nothing is written there; the log names the fix."""
    store, key, marker = _store(tmp_path), _key(), tmp_path / "PWNED"
    _plant_signed(store.path(key), key, marker, load_key(store.key_file))
    os.chmod(store.root, 0o775)
    got = store.load(key, args=())
    assert not marker.exists()
    assert got.compiled is None and got.damaged
    assert "writable by its group or others (mode 0775)" in got.reason
    assert f"chmod go-w {store.root}" in got.reason
    before = sorted(p.name for p in store.root.iterdir())
    with caplog.at_level(logging.WARNING):
        assert store.save(key, object()) is None
    assert sorted(p.name for p in store.root.iterdir()) == before
    assert any("not stored" in r.getMessage() and "0775" in r.getMessage()
               for r in caplog.records)


def test_group_writable_file_in_a_private_store_is_refused(tmp_path):
    """A signed file that its group could have rewritten is not read."""
    store, key, marker = _store(tmp_path), _key(), tmp_path / "PWNED"
    _plant_signed(store.path(key), key, marker, load_key(store.key_file))
    os.chmod(store.path(key), 0o664)
    got = store.load(key, args=())
    assert not marker.exists() and got.compiled is None
    assert "the file is writable by its group or others (mode 0664)" in got.reason


def test_symlink_in_the_store_is_not_followed(tmp_path):
    """A link planted under the right name (to a correctly signed file elsewhere) is refused."""
    store, key, marker = _store(tmp_path), _key(), tmp_path / "PWNED"
    elsewhere = tmp_path / "elsewhere.xla"
    _plant_signed(elsewhere, key, marker, load_key(store.key_file))
    store.path(key).symlink_to(elsewhere)
    got = store.load(key, args=())
    assert not marker.exists() and got.compiled is None and got.damaged


# ---- the key ------------------------------------------------------------------------------------

def test_key_is_created_once_private_and_outside_the_store(tmp_path):
    """Absent: created with mode 0600 (whatever the umask); a second load reads the same key."""
    path = tmp_path / "cfg" / "executables.key"
    old = os.umask(0)
    try:
        first = load_key(path)
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert load_key(path) == first and len(first) >= 32
    assert [p.name for p in path.parent.iterdir()] == ["executables.key"]  # no temp left


@pytest.mark.parametrize("mode,words", [(0o644, "open to others"),
                                        (0o620, "writable by others")])
def test_key_others_can_read_or_write_is_refused(tmp_path, mode, words):
    """A key others can read could sign forgeries: refused, naming chmod."""
    path = tmp_path / "executables.key"
    path.write_text("k" * 64)
    os.chmod(path, mode)
    with pytest.raises(Untrusted, match=words) as info:
        load_key(path)
    assert "chmod" in str(info.value)


def test_key_that_cannot_be_created_turns_the_store_off_saying_why(tmp_path):
    """No key and nowhere to create one (its folder is a file): nothing loads, the reason names
    the key's path and the fix."""
    (tmp_path / "not-a-dir").write_text("")
    store = ExecutableStore(tmp_path / "store", key_file=str(tmp_path / "not-a-dir" / "k"))
    key = _key()
    store.root.mkdir(mode=0o755)
    _plant_unsigned(store.path(key), key, tmp_path / "PWNED")
    got = store.load(key, args=())
    assert got.compiled is None and not (tmp_path / "PWNED").exists()
    assert "is missing and cannot be created" in got.reason and ENV_KEY in got.reason


def test_key_path_comes_from_the_environment_and_never_the_home_dir_in_tests():
    """The suite's key is a temporary file (tests/conftest.py); the default is per user."""
    assert key_path() == os.environ[ENV_KEY]
    assert not key_path().startswith(os.path.expanduser("~/.config"))
    assert key_path({}) == os.path.expanduser("~/.config/tpu-orchestrator/executables.key")


def test_hosts_get_the_key_path_never_the_key(tmp_path):
    """HostSpec carries the key file's path; the key's bytes appear nowhere in it."""
    from orchestrator.config import load_config
    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import plan_mesh

    cfg = load_config(None, [])
    hosts = [HostRef(index=0, slice_name="s", worker_id=0, node_id="n0", node_ip="10.0.0.1",
                     instance="vm-0", devices=2)]
    plan = plan_mesh(cfg, hosts, platform="cpu")
    spec = HostSpec.for_host(cfg, plan, plan.hosts[0], checkpoint_dir="/r/c",
                             executables_dir="/r/e", executables_key=str(tmp_path / "k"))
    assert spec.executables_key == str(tmp_path / "k")
    secret = load_key(tmp_path / "k")
    assert secret.decode() not in repr(spec)


def test_kuberay_pods_mount_the_executables_key_secret_read_only():
    """Head and TPU workers: $TPU_ORCH_EXECUTABLES_KEY names a file of a read-only Secret mount,
    private to the pod's user and group."""
    for name in ("raycluster-tpu.yaml", "rayjob-example.yaml"):
        for doc in yaml.safe_load_all((REPO / "deploy" / "kuberay" / name).read_text()):
            spec = doc["spec"].get("rayClusterSpec", doc["spec"])
            groups = [spec["headGroupSpec"], *spec["workerGroupSpecs"]]
            for pod in (g["template"]["spec"] for g in groups):
                c = pod["containers"][0]
                env = {e["name"]: e.get("value") for e in c["env"]}
                key_dir = env[ENV_KEY].rsplit("/", 1)[0]
                mount = next(m for m in c["volumeMounts"] if m["mountPath"] == key_dir)
                assert mount["readOnly"] is True
                vol = next(v for v in pod["volumes"] if v["name"] == mount["name"])
                assert vol["secret"]["secretName"].endswith("executables-key")
                # what load_key accepts of a root-owned file: group read at most
                assert vol["secret"]["defaultMode"] & 0o037 == 0
