"""A run directory is data, not a control channel (issue 49, finding 1 and the lows on files).

Whoever can write a runs directory (a bucket writer, another user) plants a link where the driver
writes, waits for a restart, and has the driver write known text into the executables key; then
signs an executable with that text and every host runs it. Here: no write follows a link (a
rename replaces it, an append refuses it), the key lives outside what the orchestrator writes, a
padded or forged executable is refused before its body is read whole, a manifest names only its
own directory's files, and an export never reads a step through a link.

Planted executables are valid pickles whose unpickling creates a marker file: its absence is the
proof nothing ran. No Ray, no JAX compile.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import threading
import time
import tracemalloc
from pathlib import Path

import pytest
import structlog

from orchestrator.config import load_config
from orchestrator.shared.errors import ConfigError
from orchestrator.shared.files import append_jsonl
from orchestrator.shared.host_env import ENV_KEY
from workers.training.exec_auth import load_key
from workers.training.executables import ExecutableStore, encode, executable_key


class _Plant:
    """Unpickling this creates ``marker`` (what an attacker's code would do, harmlessly)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (open, (str(self.marker), "w"))


def _exe_key() -> dict:
    return executable_key(function="train_step", runtime={"jax": "0.10.2"}, config={"lr": 1},
                          mesh={"shape": [1]}, process_index=0, process_count=1)


def _forge(store: ExecutableStore, key: dict, marker: Path, signing_key: bytes) -> Path:
    """The store's exact layout for ``key``, a payload body, MAC under ``signing_key``."""
    import hashlib

    body = pickle.dumps(_Plant(marker))
    header = {"key": key, "body_len": len(body), "body_sha256": hashlib.sha256(body).hexdigest()}
    store.root.mkdir(mode=0o755, parents=True, exist_ok=True)
    path = store.path(key)
    path.write_bytes(encode(signing_key, header, body))
    return path


def _as_load_key_reads(text: bytes) -> bytes:
    """What ``load_key`` would take for a key file holding ``text``."""
    return text[:4096].strip()


@pytest.fixture
def key(tmp_path, monkeypatch) -> Path:
    """The driver's executables key: a private file outside every run directory."""
    path = tmp_path / "home" / ".config" / "tpu-orchestrator" / "executables.key"
    load_key(path)  # created 0600
    monkeypatch.setenv(ENV_KEY, str(path))
    return path


def _cfg(run_dir: Path, *overrides: str):
    return load_config(None, [f"run.run_dir={run_dir}", "run.name=exp", *overrides])


# ---- finding 1: the chain ---------------------------------------------------------------------

def test_a_link_planted_at_config_yaml_never_rewrites_the_key_and_no_forgery_runs(tmp_path, key):
    """The attack as found: config.yaml replaced by a link to the key, the driver's start-up
    writes of the run directory (as at every restart), then an executable signed with the text
    the driver writes there. The key is byte-for-byte unchanged, config.yaml is a file of its
    own again, and the forgery is refused before it is unpickled."""
    from orchestrator.main import Driver

    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    before = key.read_bytes()
    (run_dir / "config.yaml").symlink_to(key)

    driver = Driver(_cfg(run_dir), argv=[])
    try:
        driver._prepare_run_dir()
    finally:
        structlog.contextvars.unbind_contextvars("run_id", "job")

    config = run_dir / "config.yaml"
    store, exe, marker = ExecutableStore(run_dir / "executables", key_file=str(key)), \
        _exe_key(), tmp_path / "PWNED"
    _forge(store, exe, marker, _as_load_key_reads(config.read_bytes()))
    got = store.load(exe, args=())
    assert not marker.exists(), "the forged executable's payload ran"
    assert got.compiled is None and "signature does not verify" in got.reason
    assert key.read_bytes() == before
    assert not config.is_symlink() and "run_dir" in config.read_text()


# ---- finding 1: every append refuses a link ---------------------------------------------------

def _driver_log(path: Path) -> None:
    from orchestrator.driver.logs import _Tee

    tee = _Tee(json_stream=False)
    tee.msg('{"message": "early"}', None)  # written at attach
    tee.attach_file(path)
    tee.msg('{"message": "later"}', None)


def _workers_log(path: Path) -> None:
    from orchestrator.driver.worker_output import WorkerOutput

    out = WorkerOutput(echo=False)
    out({"lines": ["early"], "pid": 1})  # written at attach
    out.attach(path)
    out({"lines": ["later"], "pid": 1})


def _metrics(path: Path) -> None:
    from orchestrator.metrics.jsonl import JsonlSink
    from tests.metrics.synthetic import step_record

    sink = JsonlSink(path)
    sink.on_step(step_record(1, time.time(), inc=0, slices=1))
    sink.close()


def _events(path: Path) -> None:
    from orchestrator.events.eventlog import JsonlWriter

    writer = JsonlWriter(path)
    writer.write({"decision": "accepted"})
    writer.close()


def _audit(path: Path) -> None:
    append_jsonl(path, {"at": 1})


def _trace(path: Path) -> None:
    import numpy as np

    from workers.input.source import _Trace

    trace = _Trace(str(path.parent))
    trace.write(1, range(0, 2), np.arange(2), 0)
    trace.close()


APPENDERS = {
    "driver.log.jsonl": _driver_log, "metrics.jsonl": _metrics, "events.jsonl": _events,
    "audit.jsonl": _audit, "samples-HOST-PID.jsonl": _trace, "workers.log": _workers_log,
}
"""By the file each writes; a host's sample trace is named by its host and process, filled in
when the test runs (a test id must be the same in every xdist worker)."""


@pytest.mark.parametrize("name", sorted(APPENDERS))
def test_an_append_never_follows_a_link_planted_at_its_name(tmp_path, key, name):
    """The driver's log, metrics and event log, the autoresume state's appends, a host's sample
    trace: a link at the name is refused (naming the file and the fix), the key untouched."""
    before = key.read_bytes()
    write = APPENDERS[name]
    name = name.replace("HOST", socket.gethostname()).replace("PID", str(os.getpid()))
    path = tmp_path / "run" / name
    path.parent.mkdir()
    path.symlink_to(key)
    try:
        write(path)
    except OSError as exc:
        refused: OSError | None = exc
    else:
        refused = None
    assert key.read_bytes() == before
    from orchestrator.shared.files import UnsafeFile

    assert isinstance(refused, UnsafeFile)
    assert f"{path} is a symbolic link" in str(refused) and f"rm {path}" in refused.fix


def test_the_timeline_never_appends_through_a_link_and_the_run_goes_on(tmp_path, key):
    """timeline.jsonl is written at every transition: a link there is logged, never followed,
    and never stops the run."""
    from orchestrator.lifecycle import Lifecycle, RunState

    before = key.read_bytes()
    (tmp_path / "timeline.jsonl").symlink_to(key)
    life = Lifecycle(run_dir=tmp_path)
    assert life.state is RunState.PLANNING
    assert key.read_bytes() == before


def test_a_link_planted_at_the_driver_log_is_bad_input_naming_the_file_and_the_fix(tmp_path,
                                                                                   key):
    """The driver's exit-2 path (``main``'s bad input) takes it, and says what to remove."""
    from orchestrator import main as driver_main
    from orchestrator.main import explain
    from orchestrator.shared.files import UnsafeFile

    path = tmp_path / "driver.log.jsonl"
    path.symlink_to(key)
    with pytest.raises(UnsafeFile) as info:
        _driver_log(path)
    def bare(text: str) -> str:  # explain() wraps lines, at hyphens too
        return "".join(text.split())

    text = bare(explain(info.value))
    assert text.startswith(bare(f"Unsafe file in the run directory: {path} is a symbolic link"))
    assert bare(f"Fix: remove {path} (`rm {path}`") in text
    assert "UnsafeFile" in driver_main.main.__code__.co_names  # among main's bad input
    again = pickle.loads(pickle.dumps(info.value))  # it crosses actor boundaries whole
    assert (type(again), str(again), again.fix) == (UnsafeFile, str(info.value), info.value.fix)


def test_tensorboard_files_are_not_named_so_a_link_could_wait_for_them(tmp_path, key):
    """tensorboardX opens its file plainly: links planted at every name the next minute could
    give are never written through (the name carries a random part)."""
    from orchestrator.metrics.tensorboard import TensorBoardSink
    from tests.metrics.synthetic import step_record

    before = key.read_bytes()
    logdir = tmp_path / "tensorboard"
    logdir.mkdir()
    now = int(time.time())
    for t in range(now - 2, now + 60):
        (logdir / f"events.out.tfevents.{t}.{socket.gethostname()}").symlink_to(key)
    sink = TensorBoardSink(logdir)
    sink.on_step(step_record(1, time.time(), inc=0, slices=1))
    sink.close()
    assert key.read_bytes() == before
    written = [p for p in logdir.iterdir() if not p.is_symlink()]
    assert len(written) == 1 and written[0].stat().st_size > 0


def test_the_reason_note_of_a_step_moved_aside_is_not_written_through_a_link(tmp_path, key):
    """A step directory planted with a link at the note's name: the note replaces the link."""
    from orchestrator.shared.layout import REASON_FILE, move_aside

    before = key.read_bytes()
    step = tmp_path / "checkpoints" / "7"
    step.mkdir(parents=True)
    (step / REASON_FILE).symlink_to(key)
    moved = move_aside(step, "damaged")
    assert key.read_bytes() == before
    assert (moved / REASON_FILE).read_text() == "damaged\n"


def test_an_append_refuses_a_second_name_of_another_file_and_never_blocks_on_a_fifo(tmp_path):
    """A hard link to another file is refused (that file keeps its content); a FIFO planted at
    the name is refused at once, where opening it would block the writer for good."""
    other = tmp_path / "other"
    other.write_text("kept\n")
    os.link(other, tmp_path / "hard")
    with pytest.raises(OSError, match="2 names"):
        append_jsonl(tmp_path / "hard", {"a": 1})
    assert other.read_text() == "kept\n"
    os.mkfifo(tmp_path / "fifo")
    outcome: list[BaseException | None] = []

    def append() -> None:
        try:
            append_jsonl(tmp_path / "fifo", {"a": 1})
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc)

    t = threading.Thread(target=append, daemon=True)
    t.start()
    t.join(timeout=5)
    assert outcome and "not a regular file" in str(outcome[0])


# ---- finding 1: keys live outside every directory the orchestrator writes -----------------------

@pytest.mark.parametrize("where", ["run directory", "runs root", "store", "link in run directory",
                                   "run directory is a link to the key's"])
def test_a_key_in_a_directory_the_run_writes_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, check_here, where):
    """``$TPU_ORCH_EXECUTABLES_KEY`` inside the run directory, its runs root or the executable
    store (or reached through a link there): the driver raises ConfigError (exit 2) naming the
    setting and the fix, before it takes the run directory's lock. (The cluster settings fail
    at once, without Ray, should the key pass.)"""
    from orchestrator.main import Driver

    runs = tmp_path / "runs"
    run_dir, store = runs / "exp", tmp_path / "store"
    private = tmp_path / "private"
    private.mkdir()
    key = {"run directory": run_dir / "executables.key", "runs root": runs / "k",
           "store": store / "k", "link in run directory": run_dir / "k",
           "run directory is a link to the key's": private / "executables.key"}[where]
    if where == "link in run directory":
        run_dir.mkdir(parents=True)
        (run_dir / "k").symlink_to(private / "executables.key")
    if where == "run directory is a link to the key's":
        runs.mkdir()
        run_dir.symlink_to(private)
    monkeypatch.setenv(ENV_KEY, str(key))
    cfg = _cfg(run_dir, f"compile.dir={store}", "cluster.mode=emulate",
               "cluster.address=127.0.0.1:9")
    with pytest.raises(ConfigError) as info:
        Driver(cfg, argv=[]).run()
    assert info.value.setting == f"${ENV_KEY}" and str(key) in info.value.message
    assert "outside every directory the orchestrator writes" in info.value.fix
    assert not (run_dir / "driver.lock").exists() and not store.exists()


def test_a_key_beside_a_run_in_the_home_directory_is_not_a_runs_root(tmp_path, monkeypatch):
    """A run directory straight in the home directory: the home is not a runs root, so the
    default key under ~/.config stays usable; with the store off no key is checked at all."""
    from orchestrator.driver.key_place import check_key_place

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    env = {}  # the per-user default key
    check_key_place(_cfg(home / "exp", f"compile.dir={tmp_path / 'store'}"), home / "exp", env)
    cfg = _cfg(tmp_path / "runs" / "exp", "compile.cache=off")
    check_key_place(cfg, tmp_path / "runs" / "exp", {ENV_KEY: str(tmp_path / "runs" / "k")})


@pytest.mark.parametrize("where", ["cluster tool's default state", "cluster tool's state",
                                   "emulated clusters' records"])
def test_a_key_where_the_cluster_tools_write_is_refused_before_anything_is_written(
        tmp_path, monkeypatch, check_here, where):
    """The orchestrator writes more than the run: the local cluster tool its state, token and
    node logs (``~/.tpu-orchestrator/local-cluster`` or ``$TPU_ORCHESTRATOR_CLUSTER_DIR``), the
    emulated clusters their reaper's records (``$TMPDIR/tpu-orchestrator-UID/emulated``). A key
    there is refused as one in the run directory is: ConfigError naming the place and the
    setting that moves it, before the run directory's lock."""
    import tempfile

    from orchestrator.main import Driver

    home, tmp = tmp_path / "home", tmp_path / "tmp"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))  # what $TMPDIR would make it
    if where == "cluster tool's state":
        monkeypatch.setenv("TPU_ORCHESTRATOR_CLUSTER_DIR", str(tmp_path / "cluster"))
    key = {"cluster tool's default state": home / ".tpu-orchestrator" / "local-cluster" / "k",
           "cluster tool's state": tmp_path / "cluster" / "k",
           "emulated clusters' records": tmp / f"tpu-orchestrator-{os.getuid()}" / "emulated"
           / "k"}[where]
    monkeypatch.setenv(ENV_KEY, str(key))
    run_dir = tmp_path / "runs" / "exp"
    cfg = _cfg(run_dir, f"compile.dir={tmp_path / 'store'}", "cluster.mode=emulate",
               "cluster.address=127.0.0.1:9")
    with pytest.raises(ConfigError) as info:
        Driver(cfg, argv=[]).run()
    assert info.value.setting == f"${ENV_KEY}" and str(key) in info.value.message
    moves = "$TMPDIR" if where == "emulated clusters' records" else "$TPU_ORCHESTRATOR_CLUSTER_DIR"
    assert "outside every directory the orchestrator writes" in info.value.fix
    assert moves in info.value.fix
    assert not (run_dir / "driver.lock").exists()


def test_a_key_inside_the_store_is_refused_by_the_store_itself(tmp_path):
    """Hosts as well: a store whose key lies inside it loads nothing and stores nothing."""
    root = tmp_path / "store"
    root.mkdir(mode=0o755)
    store = ExecutableStore(root, key_file=str(root / "keys" / "k"))
    exe, marker = _exe_key(), tmp_path / "PWNED"
    _forge(store, exe, marker, load_key(root / "keys" / "k"))
    got = store.load(exe, args=())
    assert not marker.exists(), "the payload ran"
    assert got.compiled is None and "lies in the store" in got.reason


# ---- low: a padded or forged executable is refused before its body is read whole ---------------

def _peak_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


PADDING = 256 << 20


def test_a_valid_executable_padded_sparse_is_refused_without_reading_the_padding(tmp_path, key):
    """A correctly signed file grown (sparse) by 256 MiB: refused by its size, the padding never
    read (Python's peak allocation stays under 16 MiB; it was the whole file)."""
    store, exe, marker = ExecutableStore(tmp_path / "store", key_file=str(key)), _exe_key(), \
        tmp_path / "PWNED"
    path = _forge(store, exe, marker, load_key(key))
    os.truncate(path, path.stat().st_size + PADDING)
    got = []
    peak = _peak_while(lambda: got.append(store.load(exe, args=())))
    assert peak < 16 << 20, f"{peak >> 20} MiB allocated"
    assert got[0].compiled is None and "the header says" in got[0].reason
    assert not marker.exists()


def test_a_forged_header_claiming_a_huge_body_costs_one_chunk(tmp_path, key):
    """A header that says 256 MiB, a 256 MiB sparse body that matches its checksum, a MAC under
    no key we hold: the MAC is checked chunk by chunk and fails; the body is never held whole."""
    import hashlib

    from workers.training.executables import MAGIC

    store, exe = ExecutableStore(tmp_path / "store", key_file=str(key)), _exe_key()
    zeros = hashlib.sha256()
    for _ in range(PADDING >> 20):
        zeros.update(bytes(1 << 20))
    line = json.dumps({"key": exe, "body_len": PADDING,
                       "body_sha256": zeros.hexdigest()}).encode() + b"\n"
    store.root.mkdir(mode=0o755)
    path = store.path(exe)
    path.write_bytes(MAGIC + os.urandom(32).hex().encode() + b"\n" + line)
    os.truncate(path, path.stat().st_size + PADDING)
    got = []
    peak = _peak_while(lambda: got.append(store.load(exe, args=())))
    assert peak < 16 << 20, f"{peak >> 20} MiB allocated"
    assert got[0].compiled is None and "signature does not verify" in got[0].reason


# ---- low: a manifest names its own directory's files only ---------------------------------------

@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> Path:
    from tests.input.conftest import make_dataset

    return Path(make_dataset(tmp_path_factory.mktemp("escape"), "bin"))


@pytest.mark.parametrize("how", ["dotdot", "absolute", "nested dotdot", "tokenizer"])
def test_a_manifest_naming_files_outside_its_directory_is_refused(prepared, tmp_path, how):
    """Shard (or tokenizer) names with '..' or an absolute path, the files there matching the
    listed size and sha256: refused by ``load`` and ``verify`` naming the file, nothing read;
    a name in a subdirectory is still read."""
    from orchestrator.data.manifest import MANIFEST, load, verify
    from orchestrator.shared.errors import DataError

    data = tmp_path / "data"
    data.mkdir()
    doc = json.loads((prepared / MANIFEST).read_text())
    for name in [doc["tokenizer"]["file"], *(s["path"] for s in doc["shards"])]:
        (tmp_path / name).write_bytes((prepared / name).read_bytes())  # beside, not inside
    first = doc["shards"][0]["path"]
    renamed = {"dotdot": f"../{first}", "absolute": str(tmp_path / first),
               "nested dotdot": f"sub/../../{first}", "tokenizer": None}[how]
    if how == "tokenizer":
        renamed = doc["tokenizer"]["file"] = f"../{doc['tokenizer']['file']}"
    else:
        doc["shards"][0]["path"] = renamed
    for s in doc["shards"][1:]:
        (data / s["path"]).write_bytes((prepared / s["path"]).read_bytes())
    if how == "tokenizer":
        (data / first).write_bytes((prepared / first).read_bytes())
    else:
        (data / doc["tokenizer"]["file"]).write_bytes(
            (prepared / doc["tokenizer"]["file"]).read_bytes())
    (data / MANIFEST).write_text(json.dumps(doc))
    for check in (load, verify):
        with pytest.raises(DataError) as info:
            check(str(data))
        assert f"lists {renamed!r}, which is not a file inside" in str(info.value)
    if how == "dotdot":  # a name in a subdirectory stays inside: read as before
        (data / "sub").mkdir()
        (tmp_path / first).rename(data / "sub" / first)
        doc["shards"][0]["path"] = f"sub/{first}"
        (data / MANIFEST).write_text(json.dumps(doc))
        assert load(str(data)).shards[0].path == f"sub/{first}"
        verify(str(data))


# ---- low: an export never reads a step through a link -------------------------------------------

def _committed(step_dir: Path) -> None:
    from orchestrator.shared.layout import COMMIT_MARKER, STEP_METADATA

    (step_dir / "state").mkdir(parents=True)
    (step_dir / COMMIT_MARKER).write_text("ok")
    (step_dir / STEP_METADATA).write_text("{}")


@pytest.mark.parametrize("where", ["step", "checkpoints", "inside the step"])
def test_an_export_refuses_a_step_reached_through_a_link(tmp_path, where):
    """A committed-looking step outside the run, linked in as the step, as checkpoints/, or as a
    file inside a step: ``choose`` refuses with the link and the fix; nothing is read."""
    from orchestrator.export.select import ExportError, choose

    run, outside = tmp_path / "run", tmp_path / "elsewhere"
    run.mkdir()
    _committed(outside / "5")
    if where == "step":
        (run / "checkpoints").mkdir()
        (run / "checkpoints" / "5").symlink_to(outside / "5")
        link = run / "checkpoints" / "5"
    elif where == "checkpoints":
        (run / "checkpoints").symlink_to(outside)
        link = run / "checkpoints"
    else:
        _committed(run / "checkpoints" / "5")
        link = run / "checkpoints" / "5" / "state" / "array"
        link.symlink_to(outside / "5" / "state")
    for step in (None, 5):
        with pytest.raises(ExportError) as info:
            choose(run, step)
        assert f"through the symbolic link {link}" in info.value.message
        assert f"rm {link}" in info.value.fix


# ---- the RAM tier's secret is read only from a private file of the run's user -------------------

KNOWN = "a" * 64  # the secret the planter knows: with it, RAM copies and holder proofs are forged


def _plant_secret(run_dir: Path, how: str, theirs: Path) -> Path:
    """``RUN_DIR/ram_secret`` as a runs-directory writer leaves it, ``theirs`` holding KNOWN."""
    path = run_dir / "ram_secret"
    theirs.write_text(KNOWN + "\n")
    if how == "link":
        path.symlink_to(theirs)
    elif how == "hard link":
        os.link(theirs, path)
    elif how == "fifo":
        os.mkfifo(path)
    elif how == "another user's":
        path.write_text(KNOWN + "\n")
        os.chmod(path, 0o600)
        os.chown(path, 65534, 65534)
    else:  # ours, but others may read it (and so know it)
        path.write_text(KNOWN + "\n")
        os.chmod(path, {"group-readable": 0o640, "world-readable": 0o644}[how])
    return path


def _run_secret_or_error(run_dir: Path) -> tuple[object, BaseException | None]:
    from orchestrator.raygroup.ram_holders import run_secret

    return _answer_or_error(lambda: run_secret(run_dir), "run_secret")


def _answer_or_error(fn, who: str) -> tuple[object, BaseException | None]:
    """``fn()``'s answer or error; from a thread, so a read that blocks (a FIFO read plainly)
    fails the test instead of hanging it."""
    out: list[tuple[object, BaseException | None]] = []

    def read() -> None:
        try:
            out.append((fn(), None))
        except BaseException as exc:  # handed to the test
            out.append((None, exc))

    t = threading.Thread(target=read, daemon=True)
    t.start()
    t.join(timeout=5)
    assert out, f"{who} blocked reading ram_secret"
    return out[0]


@pytest.mark.parametrize("how", [
    "link", "hard link", "fifo", "group-readable", "world-readable",
    pytest.param("another user's", marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="gives a file to uid 65534 (root only)"))])
def test_a_ram_secret_others_chose_or_can_read_is_refused_naming_the_file_and_the_fix(
        tmp_path, how):
    """A later driver of the run (autoresume's) reads RUN_DIR/ram_secret back: a link (to a file
    the planter wrote), a second name of such a file, a FIFO, another user's file or one its
    group or others may read is ``UnsafeFile`` (the driver: exit 2) naming the file and the
    fix, never a secret the planter knows; the file planted is left as it was."""
    from orchestrator.main import explain
    from orchestrator.shared.files import UnsafeFile

    run_dir = tmp_path / "runs" / "exp"
    run_dir.mkdir(parents=True)
    path = _plant_secret(run_dir, how, tmp_path / "theirs")
    got, error = _run_secret_or_error(run_dir)
    assert got is None, f"the driver used the planted secret: {got}"
    assert isinstance(error, UnsafeFile), error
    def bare(text: str) -> str:  # explain() wraps lines, at hyphens too
        return "".join(text.split())

    text = bare(explain(error))
    assert text.startswith(bare(f"Unsafe file in the run directory: {path} is "))
    assert bare("a secret is read only from a private file of the run's user") in text
    assert bare(f"Fix: remove {path} (`rm {path}`)") in text and "owner-only" in text
    assert os.path.lexists(path) and (tmp_path / "theirs").read_text() == KNOWN + "\n"


def test_on_fuse_owner_and_mode_tell_nothing_but_a_link_is_still_refused(tmp_path,
                                                                          monkeypatch):
    """On the runs bucket's GCS FUSE mount every file shows the mount's owner and mode (0664
    with GKE's fsGroup): a resumed run there reads its secret (refusing it would stop every
    resume); a link there is still refused. ``fs_type`` reads the filesystem's magic number
    (procfs: 0x9FA0), which is how FUSE is told."""
    from orchestrator.raygroup.ram_holders import run_secret
    from orchestrator.shared import files

    fd = os.open("/proc/self/status", os.O_RDONLY)
    try:
        assert files.fs_type(fd) == 0x9FA0
    finally:
        os.close(fd)
    monkeypatch.setattr(files, "_on_fuse", lambda fd: True)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    ours = _plant_secret(run_dir, "world-readable", tmp_path / "theirs")
    assert run_secret(run_dir) == (KNOWN, False)
    ours.unlink()
    _plant_secret(run_dir, "link", tmp_path / "theirs")
    with pytest.raises(files.UnsafeFile, match="is a symbolic link"):
        run_secret(run_dir)


def _forged_copy(run_dir: Path, secret: str) -> dict:
    """A complete RAM-tier step 4 in ``run_dir``'s durable copies, MACed with ``secret``: what a
    planter who knows the secret writes. Its parameters, by name."""
    import jax.numpy as jnp

    from workers.ram import auth as ram_auth
    from workers.ram import copy_store, replica

    layout, data = replica.pack({"params": {"w": jnp.arange(4.0)}})
    mac = ram_auth.copy_mac(ram_auth.Keys.from_token(secret).copy, incarnation=1, step=4,
                            source=0, sources=1, layout=layout, data=data)
    copy_store.write(copy_store.copies_dir(run_dir / "checkpoints"), step=4, source=0,
                     sources=1, incarnation=1, layout=layout, data=data, mac=mac)
    return {"params/w": [0.0, 1.0, 2.0, 3.0]}


@pytest.mark.parametrize("how", [
    "link", "hard link", "fifo", "world-readable",
    pytest.param("another user's", marks=pytest.mark.skipif(
        os.geteuid() != 0, reason="gives a file to uid 65534 (root only)"))])
def test_an_export_reads_ram_secret_only_from_a_private_file_of_its_user(tmp_path, how):
    """``python -m orchestrator.export`` checks a RAM-tier step with RUN_DIR/ram_secret: a
    planted link (or second name, FIFO, a file others can read or another user's) to a secret
    the planter knows would pass their forged copy as the run's. It is an ``ExportError``
    naming the file and the fix, nothing read; the run's own private secret still exports."""
    from orchestrator.export.read import read
    from orchestrator.export.select import ExportError, choose

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    params = _forged_copy(run_dir, KNOWN)
    path = _plant_secret(run_dir, how, tmp_path / "theirs")
    source = choose(run_dir)
    got, error = _answer_or_error(lambda: read(source, run_dir, with_opt_state=False), "export")
    assert got is None, f"the export took the forged copy as the run's: {got}"
    assert isinstance(error, ExportError), error
    assert f"{path} is " in error.message and "private file of the run's user" in error.message
    assert "--step N" in error.fix and f"chmod 600 {path}" in error.fix
    assert os.path.lexists(path) and (tmp_path / "theirs").read_text() == KNOWN + "\n"
    os.unlink(path)
    (run_dir / "ram_secret").write_text(KNOWN + "\n")
    os.chmod(run_dir / "ram_secret", 0o600)
    arrays, _ = read(source, run_dir, with_opt_state=False)
    assert {k: v.tolist() for k, v in arrays.items()} == params
