"""Periodic eval on a held-out split (issue 30: ``eval.*``, ``Task.eval_data`` /
``Task.eval_step``), without a cluster: the config section and the contract refuse bad input
naming the fix; the trainer's eval (in this process, one CPU device, accumulation on) leaves the
train state bit for bit as an eval-off run's, equals the task's loss on the held-out rows, and
its executable is stored and loaded like the step's; hosts evaluate at the same steps and host 0
reports it; prepare holds the stream's last records out; the driver's task check refuses an eval
with no split, a split too short for ``eval.batches`` and held-out rows of the wrong shape; the
records reach metrics.jsonl (which the report still reads), the console and the summary.
The one real run through the driver is ``tests/tasks/test_eval_run.py``."""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from orchestrator.config import load_config
from orchestrator.controller.ledger import RecoveryLedger
from orchestrator.data.manifest import load
from orchestrator.data.prepare import PrepareConfig, prepare
from orchestrator.data.settings import DataSettings
from orchestrator.metrics.console import ConsoleSink
from orchestrator.metrics.jsonl import JsonlSink
from orchestrator.metrics.records import EvalRecord, StepRecord
from orchestrator.metrics.rundir import load_run
from orchestrator.shared.errors import ConfigError, DataError
from tests.input.conftest import corpus_slice

ROOT = Path(__file__).resolve().parents[2]
SEQ, VOCAB, HELD = 16, 512, 16
LM = ("model.d_model=32", "model.d_ff=64", "model.num_heads=2", "model.seq_len=16",
      "train.global_batch=8", "run.total_steps=6", "eval.batches=2")
TEXT_LM = "task.kind=examples.text_lm.task:make_task"


def _text_lm(data_dir: str, *overrides: str) -> list[str]:
    return [TEXT_LM, f"task.data.dir={data_dir}", f"task.vocab_size={VOCAB}",
            f"task.seq_len={SEQ}", "task.d_model=32", "task.d_ff=64", "task.num_heads=2",
            "train.global_batch=8", "run.total_steps=6", *overrides]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> dict[str, str]:
    """One slice of the shipped corpus prepared twice: without and with ``HELD`` records held
    out (the same tokenizer and token stream: prepare is deterministic)."""
    tmp = tmp_path_factory.mktemp("eval-data")
    corpus = str(corpus_slice(tmp, 20_000))
    out = {}
    for name, held in (("plain", 0), ("split", HELD)):
        out[name] = str(tmp / name)
        prepare(PrepareConfig(inputs=(corpus,), out=out[name], vocab_size=VOCAB, seq_len=SEQ,
                              shard_size=64, eval_records=held), progress=False)
    return out


# ---- config and contract --------------------------------------------------------------------

def test_the_eval_section_refuses_bad_values_naming_the_fix():
    cfg = load_config(None, ["eval.every=50"])
    assert (cfg.eval.every, cfg.eval.batches) == (50, 4)
    assert load_config(None, []).eval.every == 0, "off unless asked for"
    for override, setting, words in (
            ("eval.bogus=1", "eval.bogus", "eval.batches, eval.every"),
            ("eval.every=-1", "eval.every", "0: off"),
            ("eval.batches=0", "eval.batches", "1 or more"),
            ("eval.every=500", "eval.every", "at most 200")):
        with pytest.raises(ConfigError) as err:
            load_config(None, [override])
        assert err.value.setting == setting and words in err.value.fix, err.value


def test_the_contract_refuses_an_eval_it_cannot_run():
    import optax

    from workers.task import Task
    from workers.task.lm import TokenData

    data = TokenData(8, 16)
    base = {"init": lambda key: {}, "optimizer": optax.sgd(0.1), "data": data}
    with pytest.raises(ConfigError, match="without eval_data"):
        Task(loss=lambda p, b: (0.0, {}), eval_step=lambda p, b: {"loss": 0.0}, **base)
    with pytest.raises(ConfigError, match="no eval_step"):
        Task(step=lambda s, b: (s, {}), eval_data=data, **base)
    with pytest.raises(ConfigError, match="eval_data"):
        Task(loss=lambda p, b: (0.0, {}), eval_data=object(), **base)
    task = Task(loss=lambda p, b: (1.5, {"acc": 0.5}), eval_data=data, **base)
    assert task.eval_fn()(None, None) == {"loss": 1.5, "acc": 0.5}
    assert Task(loss=lambda p, b: (0.0, {}), **base).eval_fn() is None


# ---- the trainer ----------------------------------------------------------------------------

def _trainer(tmp_path: Path, name: str, *overrides: str, store: str | None = None):
    import jax

    from orchestrator.shared.hosts import HostRef
    from orchestrator.shared.hostspec import HostSpec
    from orchestrator.shared.plan import MeshPlan
    from workers.training.trainer import Trainer

    cfg = load_config(None, [*LM, *overrides])
    shape = cfg.validate_for(slices=1, hosts_per_slice=1, devices_per_host=1)
    host = HostRef(index=0, slice_name="local", worker_id=0, node_id="local",
                   node_ip="127.0.0.1", instance="local", devices=1)
    plan = MeshPlan(hosts=(host,), slice_names=("local",), shape=shape, devices_per_host=1,
                    platform="cpu")
    spec = HostSpec.for_host(cfg, plan, host, checkpoint_dir=str(tmp_path / name),
                             accum_steps=2, executables_dir=store)
    return Trainer(spec, devices=jax.devices()[:1])


def test_eval_leaves_training_bit_identical_and_is_stored_like_the_step(tmp_path):
    """The built-in lm task with accumulation: evals after steps 2, 4, 6 leave params,
    optimizer state, RNG and step exactly as a run without eval; an eval is the task's loss
    averaged over the held-out batches (the same rows each time, none a training row); its
    executable is compiled once, stored under its own key, and loaded by the next group."""
    import jax
    import jax.numpy as jnp

    store = str(tmp_path / "store")
    on = _trainer(tmp_path, "on", "eval.every=2", store=store)
    on.init_state(0)
    on.compile()
    assert on.eval_info is not None and on.eval_info.source == "compiled"
    evals = []
    for _ in range(6):
        if on.train_step().step % 2 == 0:
            evals.append(on.evaluate())
    again = on.evaluate()
    off = _trainer(tmp_path, "off", store=store)
    off.init_state(0)
    off.compile()
    assert off.eval_info is None, "eval off: nothing compiled for it"
    assert off.compile_info.source == "loaded", "eval.* is not in the step's key"
    for _ in range(6):
        off.train_step()
    got, want = jax.device_get(on.state), jax.device_get(off.state)
    flat = jax.tree_util.tree_flatten_with_path(got)[0]
    assert len(flat) == len(jax.tree.leaves(want)) > 4
    for (path, a), b in zip(flat, jax.tree.leaves(want), strict=True):
        np.testing.assert_array_equal(a, b, err_msg=jax.tree_util.keystr(path))

    assert [(e.step, e.batches, e.rows) for e in evals] == [(2, 2, 16), (4, 2, 16), (6, 2, 16)]
    assert again.loss == evals[-1].loss and again.step == 6, "the same rows every eval"
    assert len({e.loss for e in evals}) == 3 and all(math.isfinite(e.loss) for e in evals)
    task, params = on.task, on.state["params"]
    held = [task.eval_data.rows(0, b, range(8)) for b in range(2)]
    direct = np.mean([float(task.loss(params, jnp.asarray(rows))[0]) for rows in held])
    np.testing.assert_allclose(again.loss, direct, rtol=1e-5)
    for s in range(6):  # held-out rows come from another seed stream than any step's
        assert not np.array_equal(held[0], task.data.rows(0, s, range(8)))

    loaded = _trainer(tmp_path, "loaded", "eval.every=2", store=store)
    loaded.compile()
    assert loaded.eval_info is not None
    assert (loaded.eval_info.source, loaded.eval_info.key) == ("loaded", on.eval_info.key)
    assert on.eval_info.key != on.compile_info.key
    key = loaded.executable_key("eval_step")
    assert key["function"] == "eval_step"
    assert {k: v for k, v in loaded.executable_key("train_step").items()
            if k != "function"} == {k: v for k, v in key.items() if k != "function"}
    for tr in (on, off, loaded):
        tr.close()


class _Trainer:
    """Steps and evals as a host's trainer does them, without JAX."""

    eval_every = 2

    def __init__(self) -> None:
        self.step, self.evals = 0, []
        self.task = SimpleNamespace(tokens_per_example=15)
        self.ckpt = SimpleNamespace(committed_step=lambda: None)

    def train_step(self) -> SimpleNamespace:
        self.step += 1
        return SimpleNamespace(step=self.step, loss=1.0, grad_norm=0.0, step_time_s=0.1,
                               lr=0.0, extra={})

    def evaluate(self):
        from workers.training.outputs import EvalOutput

        self.evals.append(self.step)
        return EvalOutput(step=self.step, loss=0.5, metrics={"acc": 0.25}, batches=2, rows=16,
                          seconds=0.01)


@pytest.mark.parametrize("report", [True, False])
def test_every_host_evaluates_at_the_same_steps_and_host_0_reports_it(report):
    from workers.host.actor import HostActor

    actor = HostActor(None, {})
    actor.trainer = trainer = _Trainer()
    out = actor.run_steps(5, report=report)
    assert out["step"] == 5 and trainer.evals == [2, 4]
    if not report:
        assert out["records"] == []
        return
    evals = {r["step"]: r.get("eval") for r in out["records"]}
    assert [s for s, e in evals.items() if e] == [2, 4]
    assert evals[2]["loss"] == 0.5 and evals[2]["tokens"] == 16 * 15
    assert evals[4]["metrics"] == {"acc": 0.25} and evals[4]["split"] == "eval"


# ---- the held-out split of prepared data ----------------------------------------------------

def test_prepare_holds_the_streams_last_records_out(prepared, tmp_path):
    """The split's training records are the plain prepare's first records, its eval records
    the ones after them, read in order, never wrapped; a changed eval shard is caught."""
    from workers.input import manifest_records, open_heldout

    plain, split = load(prepared["plain"]), load(prepared["split"])
    assert not plain.eval_shards and plain.eval_records == 0
    assert split.eval_records == HELD and split.records == plain.records - HELD
    assert [s.path for s in split.eval_shards] == ["eval-00000.bin"]
    every = manifest_records(prepared["plain"], plain, seq_len=SEQ, vocab_size=VOCAB,
                             setting="x")
    train = manifest_records(prepared["split"], split, seq_len=SEQ, vocab_size=VOCAB,
                             setting="x")
    assert len(train) == split.records
    for i in (0, split.records // 2, split.records - 1):
        np.testing.assert_array_equal(train[i], every[i])
    held = open_heldout(DataSettings(dir=prepared["split"]), seq_len=SEQ, vocab_size=VOCAB,
                        global_batch=8)
    assert held is not None and len(held) == HELD
    for b in range(2):
        np.testing.assert_array_equal(held.rows(0, b, range(8)), np.stack(
            [every[split.records + 8 * b + r] for r in range(8)]))
    with pytest.raises(DataError, match=r"eval\.batches"):
        held.rows(0, 2, range(1))
    assert open_heldout(DataSettings(dir=prepared["plain"]), seq_len=SEQ, vocab_size=VOCAB,
                        global_batch=8) is None

    changed = tmp_path / "changed"
    shutil.copytree(prepared["split"], changed)
    shard = changed / "eval-00000.bin"
    flipped = bytearray(shard.read_bytes())
    flipped[0] ^= 0xFF
    shard.write_bytes(bytes(flipped))
    with pytest.raises(DataError, match=r"eval-00000\.bin"):
        open_heldout(DataSettings(dir=str(changed)), seq_len=SEQ, vocab_size=VOCAB,
                     global_batch=8)


def test_prepare_refuses_to_hold_out_everything(tmp_path):
    corpus = str(corpus_slice(tmp_path, 2_000))
    with pytest.raises(DataError) as err:
        prepare(PrepareConfig(inputs=(corpus,), out=str(tmp_path / "out"), vocab_size=300,
                              seq_len=SEQ, eval_records=10_000), progress=False)
    assert err.value.setting == "prepare --eval-records" and "leaves none" in err.value.message
    assert not (tmp_path / "out").exists()


# ---- the driver's task check ----------------------------------------------------------------

def _check(*overrides: str) -> dict:
    """The check hosts' inputs go through (``workers.task.check``), in this process."""
    from orchestrator.driver.task_check import request_for
    from workers.task.check import check

    return check(request_for(load_config(None, list(overrides))))


def test_the_task_check_refuses_an_eval_it_cannot_run(prepared):
    assert _check(*LM, "eval.every=2")["ok"], "the built-in lm has a held-out stream"
    assert _check(*_text_lm(prepared["split"], "eval.every=3", "eval.batches=2"))["ok"]
    with pytest.raises(ConfigError) as err:  # data prepared without a split
        _check(*_text_lm(prepared["plain"], "eval.every=3"))
    assert err.value.setting == "eval.every" and "--eval-records" in err.value.fix
    with pytest.raises(ConfigError) as err:  # 16 held-out records, 3 batches of 8 need 24
        _check(*_text_lm(prepared["split"], "eval.every=3", "eval.batches=3"))
    assert err.value.setting == "eval.batches"
    assert "holds 16 rows" in err.value.message and "need 24" in err.value.message
    assert "eval.batches=2 or less" in err.value.fix and "--eval-records 24" in err.value.fix
    with pytest.raises(ConfigError) as err:  # held-out rows of another shape
        _check("task.kind=tests.tasks.bad_tasks:eval_rows_wrong", "eval.every=1",
               "run.total_steps=2")
    assert "The task's eval data is refused: rows(seed, 0, range(2))" in err.value.message
    assert "(2, 5)" in err.value.message and "(2, 4)" in err.value.message


def test_main_exits_2_before_the_group_forms_on_an_eval_without_a_split(prepared, tmp_path):
    """One paragraph naming eval.every and the fix, nothing started, nothing written."""
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "orchestrator.main",
                           *_text_lm(prepared["plain"], "eval.every=3"),
                           f"run.run_dir={run_dir}"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-2000:]
    text = " ".join(done.stderr.split())
    assert "Configuration error" in text and "eval.every" in text, text[-2000:]
    assert "--eval-records" in text and "Traceback" not in text
    assert not (run_dir / "checkpoints").exists()
    assert "emulated_cluster_started" not in done.stdout + done.stderr


# ---- the records ----------------------------------------------------------------------------

def test_eval_records_reach_metrics_jsonl_the_console_and_the_summary(tmp_path):
    host = {"split": "eval", "loss": 2.0, "metrics": {"within_0_1": 0.5}, "batches": 2,
            "rows": 16, "tokens": 240, "seconds": 0.02, "wall_time": 5.0}
    rec = EvalRecord.from_host(6, host)
    assert (rec.step, rec.tokens, rec.seconds, rec.metrics) == (6, 240, 0.02,
                                                                {"within_0_1": 0.5})
    step = StepRecord.build(step=6, loss=1.0, step_time_s=0.1, tokens=120, flops=1e6,
                            grad_norm=1.0, wall_time=4.9, devices=2, peak=(1e9, "configured"),
                            incarnation=1, slices=1)
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.on_step(step)
    sink.on_eval(rec)
    sink.close()
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert lines[1] == {"kind": "eval", "split": "eval", "step": 6, "loss": 2.0,
                        "perplexity": math.exp(2.0), "tokens": 240, "seconds": 0.02,
                        "metrics": {"within_0_1": 0.5}, "wall_time": 5.0}
    run = load_run(tmp_path, now=10.0)
    assert run.total_steps == 1 and run.skipped == {}, "the report skips eval lines silently"

    out = io.StringIO()
    ConsoleSink(stream=out).on_eval(rec)
    assert out.getvalue().startswith("eval at step     6 | loss   2.0000 | perplexity      7.389")

    led = RecoveryLedger()
    led.absorb(6, None, ({"step": 6, "loss": 1.0, "step_time_s": 0.1, "eval": host},))
    assert led.last_eval == {"step": 6, "loss": 2.0, "perplexity": math.exp(2.0),
                             "tokens": 240, "batches": 2, "seconds": 0.02,
                             "metrics": {"within_0_1": 0.5}, "unit": "tokens"}
