"""The host-RAM checkpoint tier: ``replica`` (shards ⇄ bytes, into any mesh), ``replicator``
(a host's sender), ``wire`` (the TCP frames), ``auth`` (the run secret's challenge and MACs),
``holder`` and ``server`` (the per-node holder actor and its listener), ``copy_store`` (durable
saves written from RAM). The driver creates holders and the export reads copies; this package
imports nothing."""
