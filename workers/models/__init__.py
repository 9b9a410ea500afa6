"""Model families beside the tiny ``workers.training.model.DecoderLM``, each a Flax Linen module
whose parameters carry logical axis names mapped to the mesh by a rules table (``LOGICAL_RULES``
plus the family's own names). Registered as tasks through the task API."""
