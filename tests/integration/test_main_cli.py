"""``python -m orchestrator.main`` with bad input of every kind (the default run end to end is
``tests/e2e/test_user_journey.py``).

Bad input must end with a one-paragraph message naming the fix, a non-zero exit code, no
process of the run left behind and no existing checkpoint touched.
"""

from __future__ import annotations

import pytest

from tests.integration.cli import run_main


def _message(stderr: str, title: str) -> str:
    """The user-facing paragraph: from the line starting with ``title`` to the next log line.

    Ray and structlog also write to stderr (JSON lines, ``[...]``/timestamped lines); the
    message is the one block that is neither, and it must be the only one.
    """
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = stderr.splitlines()
    starts = [i for i, ln in enumerate(lines) if ln.startswith(title)]
    assert len(starts) == 1, f"expected one {title!r} paragraph in:\n{stderr[-3000:]}"
    block = []
    for ln in lines[starts[0]:]:
        if not ln.strip() or ln.startswith(("{", "[", "20")) or (block and ln.startswith(title)):
            break
        block.append(ln)
    return " ".join(block)


@pytest.mark.parametrize(("override", "setting"), [
    ("model.num_heads=3", "model.num_heads"),
    ("mesh.ici.data=3", "mesh.ici.fsdp"),
    ("model.bogus=1", "model.bogus"),
    ("train.global_batch=6", "train.global_batch"),
])
def test_invalid_config_exits_2_before_anything_starts(tmp_path, override, setting):
    """Validation runs before Ray: exit 2, the setting and a fix named, no run_dir created."""
    run_dir = tmp_path / "run"
    res = run_main([f"run.run_dir={run_dir}", override], timeout_s=120, grace_s=5)
    assert res.code == 2, res.stderr[-3000:]
    msg = _message(res.stderr, "Configuration error")
    assert f"`{setting}`" in msg and "Fix:" in msg
    assert not run_dir.exists()
    assert res.leftovers == ()


def test_missing_config_file_exits_2(tmp_path):
    res = run_main(["--config", str(tmp_path / "absent.yaml")], timeout_s=120, grace_s=5)
    assert res.code == 2
    assert "--config" in _message(res.stderr, "Configuration error")


@pytest.mark.cluster
def test_unreachable_ray_address_exits_2_and_leaves_nothing(tmp_path):
    """A Ray address nobody listens on: bounded wait, exit 2, the fix named, no process left."""
    res = run_main([f"run.run_dir={tmp_path / 'run'}", "cluster.address=127.0.0.1:1",
                    "cluster.connect_timeout_s=5"], timeout_s=180)
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    msg = _message(res.stderr, "Ray cluster unreachable")
    assert "'127.0.0.1:1'" in msg and "within 5s" in msg
    assert "Fix:" in msg and "cluster.address" in msg
    assert res.leftovers == ()


@pytest.mark.cluster
def test_too_few_hosts_exits_2_and_leaves_nothing(tmp_path):
    """3 slices asked of a 1-slice emulated cluster: exit 2 before any actor, nothing left."""
    run_dir = tmp_path / "run"
    res = run_main([f"run.run_dir={run_dir}", "cluster.mode=emulate", "cluster.slices=3",
                    "cluster.emulate.hosts_per_slice=1"])
    assert res.code == 2, (res.stdout[-2000:], res.stderr[-3000:])
    msg = _message(res.stderr, "Cluster too small")
    assert "3 complete slice" in msg
    assert "Fix:" in msg and "cluster.slices" in msg
    assert not (run_dir / "checkpoints").exists()
    assert res.leftovers == ()
