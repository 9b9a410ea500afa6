"""The host actor: one Ray actor per host (``actor.HostActor``), a shell over components that
each own what they create and take only what they need: ``warm`` (the JAX runtime joined, left
in process and joined again; a standby's imports), ``steps`` (the step loop, with ``stops``,
the stop board), ``where`` (the mirrored step and whereabouts), ``ram`` (the RAM tier's copies
and restores), ``ahead`` (compiling a shrink's step ahead), ``notices`` (forwarding the
``metadata_watcher``'s preemption notices), ``chaos`` (injected faults); ``niceness`` (idle
scheduling), ``gloo_loop`` (gloo's busy-polling event loop in the idle class, CPU platform).
JAX is imported only once the actor has set the device environment: nothing heavy here."""
