"""The training core one host process runs: ``trainer`` (mesh, sharded state, jitted step),
``model`` and ``data`` (the built-in LM and its dataset), ``checkpoints`` and ``ckpt_space``
(Orbax I/O and disk room), ``executables``, ``exec_auth`` and ``compile_share`` (stored,
signed, shared compiled steps), ``memory`` (will the state fit). Modules import JAX themselves;
this package imports nothing."""
