"""Issue 49's finding 1 as a real chain: a link planted in a run directory, a resumed run, no
payload executed.

``python -m orchestrator.main`` trains a tiny run to completion (1 slice x 2 hosts, its store
``RUN_DIR/executables``, its key outside the runs directory). Then the attacker, a writer of the
runs directory: reads ``config.yaml``, signs executables whose unpickling creates a marker file
with the text the resumed driver writes there as the key, puts them in the run's store under the
names the resumed hosts look up, and replaces ``config.yaml`` with a link to the key. The driver
is run again on the run directory with more steps. The old driver wrote ``config.yaml`` with
``write_text``, through the link: the key became that text, the forgeries verified and both hosts
unpickled them. Now the key is unchanged, ``config.yaml`` is a file of its own again, the
forgeries are refused (the hosts compile afresh and store their own under those names) and the
run resumes and succeeds.

Helpers shared with ``test_run_dir_files.py`` (the forgery, its payload, how ``load_key`` reads a
key file's text); the subprocess run as ``tests/integration/cli.py`` runs every driver.
"""

from __future__ import annotations

import json

import pytest

from orchestrator.shared.host_env import ENV_DIR, ENV_KEY
from tests.faults.harness import BASE_OVERRIDES
from tests.integration.cli import run_main
from tests.security.test_run_dir_files import _as_load_key_reads, _forge
from workers.training import executables
from workers.training.exec_auth import load_key
from workers.training.executables import SUFFIX, ExecutableStore, read_header

pytestmark = pytest.mark.cluster

FIRST, RESUMED = 5, 10  # steps: the first run's, then the resumed run's (one call each)


def _summary(run_dir) -> tuple[str, int]:
    summary = json.loads((run_dir / "summary.json").read_text())
    return summary["state"], summary["step"]


def _forge_for_the_resume(store: ExecutableStore, signing_key: bytes, marker) -> dict:
    """{path: forged bytes}: for every executable the first run stored, a forgery under the
    name the resumed hosts look up (the same key but for run.total_steps)."""
    forged = {}
    for path in sorted(store.root.glob(f"*{SUFFIX}")):
        key = read_header(path)["key"]
        key = {**key, "config": {**key["config"], "total_steps": RESUMED}}
        planted = _forge(store, key, marker, signing_key)
        forged[planted] = planted.read_bytes()
    return forged


def test_a_link_planted_in_a_run_dir_runs_no_payload_when_the_run_resumes(tmp_path,
                                                                            monkeypatch):
    key = tmp_path / "keys" / "executables.key"
    load_key(key)  # a fresh private key, outside the runs directory
    monkeypatch.setenv(ENV_KEY, str(key))
    monkeypatch.delenv(ENV_DIR, raising=False)  # the store: RUN_DIR/executables
    run_dir = tmp_path / "runs" / "exp"
    args = [*BASE_OVERRIDES, f"run.run_dir={run_dir}"]

    first = run_main([*args, f"run.total_steps={FIRST}"], timeout_s=300)
    assert first.code == 0, first.stderr[-3000:]
    assert _summary(run_dir) == ("SUCCEEDED", FIRST) and first.leftovers == ()

    # the attacker: the text the resumed driver will write to config.yaml (what it read, with
    # the resume's steps: a restart by autoresume writes the very same text), signed with
    config = run_dir / "config.yaml"
    text = config.read_bytes()
    assert text.count(f"total_steps: {FIRST}\n".encode()) == 1
    text = text.replace(f"total_steps: {FIRST}\n".encode(), f"total_steps: {RESUMED}\n".encode())
    marker = tmp_path / "PWNED"
    store = ExecutableStore(run_dir / "executables", key_file=str(key))
    forged = _forge_for_the_resume(store, _as_load_key_reads(text), marker)
    assert any(".p0-of-2" in p.name and p.name.startswith("train_step.") for p in forged), forged
    before = key.read_bytes()
    config.unlink()
    config.symlink_to(key)

    again = run_main([*args, f"run.total_steps={RESUMED}"], timeout_s=300)
    assert again.code == 0, again.stderr[-3000:]
    assert _summary(run_dir) == ("SUCCEEDED", RESUMED) and again.leftovers == ()
    assert not marker.exists(), "a forged executable's payload ran"
    assert key.read_bytes() == before
    assert config.is_file() and not config.is_symlink()
    # the forgeries carried exactly what the old driver would have written into the key ...
    assert config.read_bytes() == text
    # ... and the hosts looked them up: refused, compiled afresh, their own stored in place
    genuine = load_key(key)
    for path, bytes_forged in forged.items():
        if path.name.startswith("train_step."):
            assert path.read_bytes() != bytes_forged, f"{path.name} was never looked up"
            executables._read(path, key=genuine)  # signed with the run's own key
