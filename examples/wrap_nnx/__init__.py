"""Wrapping a Flax NNX model that already exists: ``model.py`` as its author wrote it, ``task.py``
the few lines that make it a task (docs/tasks.md, "Wrapping a model you already have")."""
