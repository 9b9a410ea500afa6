"""Bad tasks are bad input, refused on the driver before anything starts (exit 2, nothing
written): the check runs in a subprocess (``python -m workers.task.check``) and names the
setting and the fix. Also: a checkpoint of another task, and the built-in lm and the example task
passing with what the hosts will build.

The refusals run the check's own ``answer`` in this process (``tests.support.task_check``): a
subprocess each would only repeat its ~0.8 CPU-s start 13 times. The subprocess itself is
what the passing checks and ``orchestrator.main``'s exit 2 below go through."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from orchestrator.config import load_config
from orchestrator.driver.task_check import TaskSummary, check_checkpoint, check_task, run_check
from orchestrator.driver.worker_output import WorkerOutput
from orchestrator.main import explain
from orchestrator.shared import worker_log
from orchestrator.shared.errors import CheckpointError, ConfigError, TaskCodeError
from orchestrator.shared.task import task_fingerprint

BAD = "tests.tasks.bad_tasks"


def _refused(*overrides: str) -> ConfigError:
    cfg = load_config(None, list(overrides))
    with pytest.raises(ConfigError) as info:
        run_check(cfg)
    return info.value


def test_builtin_lm_and_the_example_task_pass_with_their_fingerprints():
    lm = run_check(load_config(None, ["model.d_model=32"]))
    cfg = load_config(None, ["model.d_model=32"])
    assert lm.fingerprint == cfg.model.fingerprint(), "lm's checkpoints from before tasks fit"
    assert lm.tokens_per_step == 16 * 31 and lm.flops_per_step > 0
    mlp = run_check(load_config(None, ["task.kind=examples.my_task.task:make_task"]))
    assert mlp.task == {"kind": "examples.my_task.task:make_task",
                        "settings": {"features": 8, "hidden": 64, "depth": 2}}
    assert mlp.fingerprint == task_fingerprint(mlp.task["kind"], mlp.task["settings"])
    assert mlp.metrics == ("grad_norm", "loss", "lr", "mae")


@pytest.mark.parametrize(("overrides", "setting", "words"), [
    (("task.kind=no_such_pkg.tasks:make_task",), "task.kind",
     ["'no_such_pkg.tasks' was not found", "--working-dir", "PYTHONPATH"]),
    (("task.kind=tests.tasks.raises_on_import:make_task",), "task.kind",
     ["importing the task module 'tests.tasks.raises_on_import' failed", "RuntimeError",
      "broken on purpose"]),
    ((f"task.kind={BAD}:missing",), "task.kind", ["has no function 'missing'", "good"]),
    ((f"task.kind={BAD}:not_annotated",), "task.kind", ["not annotated with a dataclass"]),
    ((f"task.kind={BAD}:good", "task.depth=2"), "task.depth",
     ["unknown setting", "task.width"]),
    ((f"task.kind={BAD}:good", "task.width=wide"), "task.width",
     ["not an integer"]),
    ((f"task.kind={BAD}:returns_dict",), "task.kind", ["returned dict, not a workers.task.Task"]),
    ((f"task.kind={BAD}:unknown_axis",), "task.kind", ["no rule maps", "'hidden'"]),
    ((f"task.kind={BAD}:indivisible", "task.width=7"), "mesh",
     ["do not divide", "(4, 7)"]),
    ((f"task.kind={BAD}:good", "task.rows_width=5"), "task.kind",
     ["rows(seed, 0, range(2))", "(2, 5)", "example() says"]),
    ((f"task.kind={BAD}:good", "task.rows_dtype=int32"), "task.kind",
     ["int32", "float32", "The task's data is refused"]),
    ((f"task.kind={BAD}:good", "task.tree=true", "task.rows_width=5"), "task.kind",
     ["give ['x'] of shape (2, 5)", "example() says shape (2, 4)"]),
    ((f"task.kind={BAD}:good", "task.narrow_after=5", "run.total_steps=20"), "task.kind",
     ["rows(seed, 19, range(", "shape (2, 3)", "example() says shape (2, 4)"]),
    ((f"task.kind={BAD}:loss_breaks",), "task.kind",
     ["The task's loss is refused: it fails when traced", "bad_tasks.py:", "TypeError"]),
])
def test_a_bad_task_is_refused_naming_the_setting_and_the_fix(check_here, overrides, setting,
                                                              words):
    exc = _refused(*overrides)
    text = str(exc)
    assert exc.setting == setting, text
    assert exc.fix, text
    for w in words:
        assert w in text, (w, text)


@pytest.mark.parametrize(("overrides", "part"), [
    ((f"task.kind={BAD}:good", "task.rows_width=5"), "data"),
    ((f"task.kind={BAD}:loss_breaks",), "loss"),
])
def test_a_fault_of_the_tasks_code_is_not_called_an_invalid_setting(check_here, overrides, part):
    """The config names the task fine; its data or loss is what is wrong, and the message says
    so (issue 53: a data error read "Invalid config `task.kind`")."""
    exc = _refused(*overrides)
    assert isinstance(exc, TaskCodeError) and exc.part == part
    shown = explain(exc)
    assert shown.startswith("Task code error: The task's"), shown
    assert "Invalid config" not in shown, shown


def test_the_tasks_own_warnings_reach_the_driver_once(tmp_path):
    """The check runs the task's factory in a subprocess: a warning it logs there is shown by
    the driver (terminal and driver.log.jsonl), not lost with the subprocess's stderr; the hosts
    build the same task and say it again, and that is not shown a second time."""
    out = WorkerOutput(echo=False)
    with capture_logs() as records:
        check_task(load_config(None, [f"task.kind={BAD}:warns"]), tmp_path, show=out.show)
        line = worker_log.format_record(logging.LogRecord(
            f"{BAD}", logging.WARNING, __file__, 1, "the task's own warning: settings look odd",
            None, None))
        out({"lines": [line], "pid": 7, "actor_name": "HostActor", "is_err": True})
    shown = [(r["text"], r["host"]) for r in records if r["event"] == "worker_warning"]
    assert shown == [("the task's own warning: settings look odd", "task check")], records


def test_a_refused_task_shows_its_warnings_first():
    with capture_logs() as records, pytest.raises(ConfigError):
        run_check(load_config(None, [f"task.kind={BAD}:warns", "task.rows_width=5"]))
    assert [r["text"] for r in records if r["event"] == "worker_warning"] == [
        "the task's own warning: settings look odd"]


def test_a_checkpoint_of_another_task_is_refused(tmp_path):
    step = tmp_path / "checkpoints" / "10"
    (step / "meta").mkdir(parents=True)
    (step / "commit_success.txt").write_text("")
    (step / "_CHECKPOINT_METADATA").write_text("{}")
    lm = {"vocab_size": 128}
    (step / "meta" / "metadata").write_text(json.dumps(
        {"step": 10, "model": lm, "model_fingerprint": task_fingerprint("lm", lm)}))
    mine = TaskSummary(fingerprint=task_fingerprint("my.task:make", {}),
                       task={"kind": "my.task:make", "settings": {}}, n_params=1,
                       state_bytes=4, flops_per_step=None, tokens_per_step=1, metrics=())
    with pytest.raises(CheckpointError) as info:
        check_checkpoint(tmp_path / "checkpoints", mine)
    assert "another task" in str(info.value) and '"kind": "lm"' in str(info.value)
    assert "task.kind" in info.value.fix and "run.run_dir" in info.value.fix
    same = TaskSummary(**{**mine.__dict__, "fingerprint": task_fingerprint("lm", lm)})
    check_checkpoint(tmp_path / "checkpoints", same)  # lm's own checkpoint from before tasks


def test_main_exits_2_on_a_bad_task_before_anything_starts(tmp_path):
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "orchestrator.main", f"run.run_dir={run_dir}",
                           f"task.kind={BAD}:unknown_axis"], capture_output=True, text=True,
                          timeout=120, check=False, cwd=Path(__file__).parents[2])
    assert done.returncode == 2, done.stderr[-2000:]
    text = " ".join(done.stderr.split())
    assert "Configuration error" in text and "no rule maps" in text, text[-2000:]
    assert not (run_dir / "run.json").exists() and not (run_dir / "checkpoints").exists()
    assert "emulated_cluster_started" not in done.stdout + done.stderr
