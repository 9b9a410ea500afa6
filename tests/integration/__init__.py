"""Integration tests of the skeleton (issue #2): real Ray, real multi-process JAX, real Orbax."""
