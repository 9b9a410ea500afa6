"""The driver's task check, run as ``python -m workers.task.check`` in a subprocess
(``orchestrator/driver/task_check.py``): JSON in on stdin, one ``TASK_CHECK {json}`` line out.

A subprocess, so the driver never imports JAX or the user's module: JAX runs here on the CPU
(``JAX_PLATFORMS=cpu``; a driver on a TPU VM must not hold its chips) and only abstractly
(``jax.eval_shape``): nothing is computed, no device holds the state. It resolves the task as a
host will, traces its init and its step, and checks what would otherwise fail a formed group:
settings, the factory's result, axis names on every parameter, dimensions the mesh cannot split,
the data's rows against its ``example()``, the step's output state and metrics.
"""

from __future__ import annotations

import dataclasses
import json
import sys
import traceback
from typing import Any

MARKER = "TASK_CHECK "
EVAL_FIX = ("set eval.every=0, or give the task a held-out split: Task(eval_data=...) "
            "(docs/tasks.md; for prepared data, prepare with --eval-records N)")


def check(request: dict) -> dict:
    import functools

    import flax.linen as nn
    import jax
    import numpy as np

    from orchestrator.shared.errors import ConfigError, TaskCodeError
    from orchestrator.shared.sections import TrainConfig
    from orchestrator.shared.task import TaskRef
    from workers.task import state as st
    from workers.task.contract import TaskContext
    from workers.task.resolve import resolve

    train = TrainConfig(**request["train"])
    ref = TaskRef(**request["task"])
    resolved = resolve(ref, TaskContext(train=train, total_steps=request["total_steps"],
                                        seed=request["seed"]))
    task = resolved.task
    try:
        boxed = resolved.abstract_boxed
    except ConfigError:
        raise
    except Exception as exc:
        raise _traced("init", exc) from exc
    specs = st.state_specs(task, boxed)
    abstract = nn.meta.unbox(boxed)
    sizes = request.get("mesh") or {}
    st.check_divisible(abstract, specs, sizes)
    load = task.init_from is not None and not request.get("resuming")
    if load:  # a resume never reads them (the run's checkpoints win): nor does its check
        task.init_from.check(abstract["params"])
    example = task.data.example()
    if not all(isinstance(e, jax.ShapeDtypeStruct) for e in jax.tree.leaves(example)):
        raise TaskCodeError("data", f"its example() is {example!r}, not a pytree of "
                          "jax.ShapeDtypeStruct", "describe one row: "
                          "jax.ShapeDtypeStruct(shape_without_batch, dtype) per leaf")
    batch = st.abstract_batch(example, 1, train.global_batch)
    st.check_divisible(batch, st.batch_specs(example), sizes, "batch")
    n = min(2, train.global_batch)
    _check_rows(task.data, example, request["seed"], n, np, jax)
    last = max(0, int(request["total_steps"]) - 1)
    if last:  # the run's last step too: data that changes shape or runs out late fails here
        _check_rows(task.data, example, request["seed"], n, np, jax, step=last,
                    rows=range(train.global_batch - n, train.global_batch))
    try:
        out_state, metrics = jax.eval_shape(functools.partial(st.train_step, task), abstract,
                                            batch)
    except ConfigError:
        raise
    except Exception as exc:
        raise _traced("loss" if task.step is None else "step", exc) from exc
    _check_step(abstract, out_state, metrics, jax)
    _check_eval(task, request, abstract, sizes, train)
    n_params = sum(int(np.prod(a.shape)) for a in jax.tree.leaves(abstract["params"]))
    state_bytes = sum(int(np.prod(a.shape)) * a.dtype.itemsize for a in jax.tree.leaves(abstract))
    return {"ok": True, "fingerprint": resolved.fingerprint, "task": resolved.describe(),
            "n_params": n_params, "state_bytes": state_bytes,
            "flops_per_step": task.flops_per_step,
            "tokens_per_step": train.global_batch * task.tokens_per_example,
            "metrics": sorted(metrics),
            "memory": _memory(request.get("memory"), abstract, specs, resolved.describe(),
                              state_bytes, sizes, load=load)}


def _memory(mem: dict | None, abstract: Any, specs: Any, task: dict, state_bytes: int,
            sizes: dict, *, load: bool = False) -> dict:
    """Bytes per device and per host over the request's mesh (``workers/training/memory.py``), and
    whether they fit its bounds: ``refused`` holds ``DoesNotFit``'s parts, else None;
    ``ram_auto_off`` why ``checkpoint.ram.enabled: auto`` turned the tier off, else None.
    ``load``: a new run loads ``Task.init_from`` (its host RAM counted, ``init_from_bytes``)."""
    from workers.training import memory

    if not mem:
        return {"device": None, "state_bytes": state_bytes,
                "unknown_axes": [a for a in ("data", "fsdp", "tensor") if a not in sizes]}
    dph = mem.get("devices_per_host")
    est = memory.estimate_state(abstract, specs, mesh_shape=mem["mesh"],
                                devices_per_host=dph or 1, accum_steps=mem.get("accum_steps", 1),
                                ram_keep=mem.get("ram_keep", 0) if dph else 0,
                                ram_max_host_bytes=mem.get("ram_max_host_bytes"))
    if load and dph:
        est = dataclasses.replace(est, load_bytes=memory.init_from_bytes(
            abstract["params"], specs["params"], mesh_shape=mem["mesh"], devices_per_host=dph))
    holders = mem.get("ram_holders", "both")
    est = dataclasses.replace(est, ram_holders="peer" if holders == "peer" else "both")
    refused = _fits(est, mem, dph, task)
    if refused and est.ram_keep and holders == "auto":
        # checkpoint.ram.holders=auto: copies on a peer only (half the RAM) before the tier
        # is turned off or the run refused for it
        peer = dataclasses.replace(est, ram_holders="peer")
        if refused["component"] != "device":  # the devices' own state is not the tier's
            est, refused = peer, _fits(peer, mem, dph, task)
    ram_auto_off = None
    if refused and est.ram_keep and mem.get("ram_auto"):
        # checkpoint.ram.enabled=auto: a tier that does not fit is turned off, never the reason
        # a run is refused (one whose state does not fit without it is refused for that)
        est = dataclasses.replace(est, ram_keep=0)
        ram_auto_off, refused = refused["message"], _fits(est, mem, dph, task)
    return {"mesh": dict(est.mesh_shape), "devices_per_host": dph,
            "hosts": est.hosts if dph else None, "device": dict(est.device),
            "device_total": est.device_total, "ram_keep": est.ram_keep,
            "holder_factor": est.holder_factor, "copy_bytes": est.copy_bytes,
            "ram_holders": est.ram_holders if est.ram_keep else None,
            "ram_tier": est.ram_tier, "state_bytes": est.state_bytes,
            "load_bytes": est.load_bytes,
            "host_total": est.device_total * dph + est.ram_tier if dph else None,
            "host_bytes": mem.get("host_bytes") if dph else None, "shared": bool(mem.get("shared")),
            "refused": refused, "ram_auto_off": ram_auto_off}


def _fits(est: Any, mem: dict, dph: int | None, task: dict) -> dict | None:
    """``memory.check_fits``: None, or ``DoesNotFit``'s parts."""
    from orchestrator.shared.errors import DoesNotFit
    from workers.training import memory

    try:
        memory.check_fits(est, device_bytes=mem.get("device_bytes"),
                          host_bytes=mem.get("host_bytes") if dph else None,
                          shared=bool(mem.get("shared")),
                          smaller=memory.smaller_model_fix(task["kind"], task["settings"]))
    except DoesNotFit as exc:
        return {"component": exc.component, "need": exc.need, "have": exc.have,
                "message": exc.message, "fix": exc.fix}
    return None


def _check_eval(task: Any, request: dict, abstract: Any, sizes: dict, train: Any) -> None:
    """With ``eval.every`` on: the task has a held-out split that holds the eval's rows (none
    read twice), its rows match its ``example()``, its batch splits over the mesh, and its eval
    traces to scalar metrics with a ``loss`` under names the metric sinks take."""
    import functools

    import jax
    import numpy as np

    from orchestrator.shared.errors import ConfigError, TaskCodeError
    from orchestrator.shared.task import METRIC_NAME
    from workers.task import state as st

    ev = request.get("eval") or {}
    every, batches = int(ev.get("every") or 0), int(ev.get("batches") or 1)
    if not every:
        return
    data, g = task.eval_data, train.global_batch
    if data is None:
        raise ConfigError("eval.every", f"eval.every={every}, but the task "
                          f"{request['task']['kind']!r} has no held-out split "
                          "(Task.eval_data is None)", EVAL_FIX)
    example = data.example()
    if not all(isinstance(e, jax.ShapeDtypeStruct) for e in jax.tree.leaves(example)):
        raise TaskCodeError("eval data", f"its example() is {example!r}, not a pytree "
                          "of jax.ShapeDtypeStruct", "describe one held-out row: "
                          "jax.ShapeDtypeStruct(shape_without_batch, dtype) per leaf")
    try:
        size = len(data)
    except TypeError:
        size = None  # an unbounded source (a seed stream)
    if size is not None and size < batches * g:
        most = size // g
        raise ConfigError("eval.batches", f"the task's held-out split holds {size} rows; "
                          f"eval.batches={batches} batches of train.global_batch={g} rows "
                          f"need {batches * g} (an eval never reads a row twice)",
                          (f"set eval.batches={most} or less, or " if most else
                           "lower train.global_batch, or ") +
                          f"hold out {batches * g} rows or more (prepared data: prepare with "
                          f"--eval-records {batches * g} or more)")
    batch = st.abstract_batch(example, 1, g)
    st.check_divisible(batch, st.batch_specs(example), sizes, "eval batch")
    for b in sorted({0, batches - 1}):
        _check_rows(data, example, request["seed"], min(2, g), np, jax, what="eval data",
                    step=b)
    try:
        metrics = jax.eval_shape(functools.partial(st.eval_step, task), abstract["params"],
                                 batch)
    except ConfigError:
        raise
    except Exception as exc:
        raise _traced("eval_step" if task.eval_step is not None else "loss (as the eval)",
                      exc) from exc
    bad = [k for k, v in metrics.items() if getattr(v, "shape", None) != ()]
    names = [k for k in metrics if k != "loss" and (k == "perplexity" or
                                                    not METRIC_NAME.match(str(k)))]
    if "loss" not in metrics or bad or names:
        raise TaskCodeError("eval", f"it returns {sorted(metrics)}: it needs a "
                          f"scalar 'loss' and scalars only (not scalar: {bad}), named with "
                          f"lower-case letters, digits and _, other than perplexity (bad: "
                          f"{names})", "return {'loss': mean_loss, 'name': mean, ...} from "
                          "Task.eval_step (or loss's dict, when eval_step is None)")


def _check_rows(data: Any, example: Any, seed: int, n: int, np: Any, jax: Any, *,
                what: str = "data", step: int = 0, rows: range | None = None) -> None:
    """The task's ``rows`` at ``step`` (``rows``: which, default the first ``n``) against its
    ``example()``: refused naming the first leaf that differs, not the whole tree."""
    from orchestrator.shared.errors import TaskCodeError

    which = range(n) if rows is None else rows
    asked = f"rows(seed, {step}, range({which.start}, {which.stop}))" if which.start else \
        f"rows(seed, {step}, range({which.stop}))"
    got_rows = data.rows(seed, step, which)
    want = jax.tree.map(lambda e: ((len(which), *e.shape), np.dtype(e.dtype)), example)
    try:
        got = jax.tree.map(lambda r: (tuple(np.shape(r)), np.asarray(r).dtype), got_rows)
    except Exception as exc:
        raise TaskCodeError(what, f"{asked} returned "
                          f"{type(got_rows).__name__} ({exc})", "return numpy arrays") from exc
    fix = "make rows() return example()'s tree with a leading axis of len(rows), in its dtypes"
    if jax.tree.structure(want, is_leaf=_pair) != jax.tree.structure(got, is_leaf=_pair):
        paths = {k: _paths(t, jax) for k, t in (("want", want), ("got", got))}
        missing = sorted(set(paths["want"]) - set(paths["got"]))[:3]
        extra = sorted(set(paths["got"]) - set(paths["want"]))[:3]
        raise TaskCodeError(what, f"{asked} give another tree than its "
                          f"example() (missing: {missing or 'none'}; not in example(): "
                          f"{extra or 'none'})", fix)
    for (path, w), (_, g) in zip(_paths(want, jax).items(), _paths(got, jax).items(),
                                 strict=True):
        if w != g:
            raise TaskCodeError(what, f"{asked} give {path or 'the row'} "
                              f"of shape {g[0]}, dtype {g[1]}, but its example() says shape "
                              f"{w[0]}, dtype {w[1]}", fix)


def _paths(tree: Any, jax: Any) -> dict[str, tuple]:
    """Leaf path (as ``jax.tree_util.keystr`` writes it) -> its (shape, dtype) pair."""
    flat = jax.tree_util.tree_flatten_with_path(tree, is_leaf=_pair)[0]
    return {jax.tree_util.keystr(p): leaf for p, leaf in flat}


def _check_step(state: Any, out_state: Any, metrics: Any, jax: Any) -> None:
    from orchestrator.shared.errors import TaskCodeError

    def sig(tree: Any) -> list:
        return [(jax.tree_util.keystr(p), tuple(x.shape), str(x.dtype))
                for p, x in jax.tree_util.tree_flatten_with_path(tree)[0]]

    if jax.tree.structure(state) != jax.tree.structure(out_state) or sig(state) != sig(out_state):
        diff = [f"{a} -> {b}" for a, b in zip(sig(state), sig(out_state), strict=False)
                if a != b][:3]
        raise TaskCodeError("step", "it returns a state of another tree, shape or "
                          f"dtype than it was given ({'; '.join(diff) or 'tree differs'})",
                          "return the state's tree unchanged in shapes and dtypes, with "
                          "step + 1")
    bad = [k for k, v in metrics.items() if getattr(v, "shape", None) != ()]
    if "loss" not in metrics or bad:
        raise TaskCodeError("step", f"its metrics {sorted(metrics)} need a scalar "
                          f"'loss' and scalars only (not scalar: {bad})",
                          "return (loss, {name: scalar}) from loss, or metrics['loss'] from "
                          "step")


def _traced(what: str, exc: Exception) -> Exception:
    from orchestrator.shared.errors import TaskCodeError

    where = ""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if "/site-packages/" not in f.filename and "/workers/task/" not in f.filename]
    if frames:
        where = f" at {frames[-1].filename}:{frames[-1].lineno}"
    return TaskCodeError(what, f"it fails when traced with the run's "
                       f"shapes{where}: {type(exc).__name__}: {str(exc)[:600]}",
                       f"fix the task's {what} (its inputs: the example()'s batch with a "
                       "leading (micro-batch) axis, the init's parameters)")


def _pair(x: Any) -> bool:
    return isinstance(x, tuple) and len(x) == 2 and isinstance(x[0], tuple)


def answer(request: dict) -> dict:
    """``check``'s answer, or the refusal it raised as ``{"ok": False, setting, problem, fix}``
    (what ``main`` prints after ``MARKER``)."""
    from orchestrator.shared.errors import ConfigError, TaskCodeError

    try:
        return check(request)
    except TaskCodeError as exc:
        return {"ok": False, "setting": exc.setting, "part": exc.part, "problem": exc.problem,
                "fix": exc.fix}
    except ConfigError as exc:
        problem = exc.message.removeprefix(f"Invalid config `{exc.setting}`: ")
        return {"ok": False, "setting": exc.setting, "problem": problem, "fix": exc.fix}
    except Exception as exc:  # a bug of the check itself: say so, with its trace
        traceback.print_exc()
        return {"ok": False, "setting": "task.kind",
                "problem": f"the task check failed: {type(exc).__name__}: {exc}",
                "fix": "see the trace above; report it if the task is not the cause"}


def main() -> int:
    from orchestrator.shared.worker_log import install

    install()  # the task's warnings reach the driver's terminal (task_check._report_warnings)
    out = answer(json.loads(sys.stdin.read()))
    sys.stdout.write("\n" + MARKER + json.dumps(out) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
