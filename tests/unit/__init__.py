"""Unit tests of the skeleton (issue #2): config, mesh plan, MEGASCALE env, data, FLOPs."""
