"""The input pipeline: token records whose position is the step (docs/data.md).

``open_source(DataSettings(dir=...), seq_len=, vocab_size=, global_batch=, total_steps=)``
verifies a directory written by ``python -m orchestrator.data prepare`` and returns a
``TokenSource``, a ``workers.task.contract.DataSource`` (``example()``, ``rows(seed, step,
rows)``) that also says ``position(step)`` (epoch, index) and ``sample_ids(seed, step)``;
``open_heldout`` the held-out split (``prepare --eval-records``) as a ``HeldOut`` eval source.
``FlatTokens`` (``.bin``/``.npy``) and ``ArrayRecordTokens`` are the Grain data sources under it.
"""

from orchestrator.data.settings import DataSettings
from workers.input.heldout import HeldOut
from workers.input.open import manifest_records, open_heldout, open_source
from workers.input.records import ArrayRecordTokens, FlatTokens, ShardSpec
from workers.input.source import Position, TokenSource, process_rows, shuffle_seed

__all__ = ["ArrayRecordTokens", "DataSettings", "FlatTokens", "HeldOut", "Position", "ShardSpec",
           "TokenSource", "manifest_records", "open_heldout", "open_source", "process_rows",
           "shuffle_seed"]
