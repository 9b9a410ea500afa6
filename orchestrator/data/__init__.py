"""Training data on the driver's side (docs/data.md): ``prepare`` a text corpus into token
shards with a manifest, ``verify`` a prepared directory before a run reads it. No JAX here: the
driver runs these before any host starts; hosts read the shards with ``workers/input``.

``manifest`` (``Manifest``, ``load``, ``verify``, ``check_model``), ``fs`` (local and ``gs://``
through fsspec), ``tokenizer``, ``prepare``; the CLI is ``python -m orchestrator.data``.
"""
