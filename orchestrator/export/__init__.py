"""Take the model out of a run: ``python -m orchestrator.export RUN_DIR [--step N] --to DIR``.

Reads one complete step of either durable tier (Orbax's ``checkpoints/<step>``, or the RAM
tier's ``checkpoints-from-ram/<step>`` after checking its HMAC with ``RUN_DIR/ram_secret``) on
this machine alone (CPU, no cluster, no mesh) and writes its parameters (``--with-opt-state``:
and the optimizer state) as ``model.npz`` and ``model.safetensors`` under flattened names
(``params/block0/q/kernel``), the exported model's task and settings as ``config.yaml``
(``rebuild(EXPORT_DIR)`` builds the model from it again), the data's tokenizer when the task's
prepared data names one, and ``export.json`` (step, tier, source, shapes, dtypes, digest). Bad
input exits 2 with the fix and writes nothing to ``--to``. ``--format hf`` instead writes a
``task.kind: llama`` run as a Hugging Face ``LlamaForCausalLM`` directory. Modules: ``select``
(which step), ``read`` (arrays to numpy), ``write`` (files, atomically), ``hf`` (the Hugging
Face format), ``rebuild`` (the model again, from an export), ``__main__`` (the command).
"""

from orchestrator.export.rebuild import rebuild
from orchestrator.export.select import ExportError
from orchestrator.export.write import export_run

__all__ = ["ExportError", "export_run", "rebuild"]
