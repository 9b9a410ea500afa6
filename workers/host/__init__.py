"""The host actor's shell: one Ray actor per host (``actor.HostActor``) and its mixins, ``warm``
(standby and in-process re-init), ``ram`` (the RAM tier's methods), ``ahead`` (compiling a
shrink's step ahead), ``where`` (whereabouts); ``stops`` (the stop board), ``niceness`` (idle
scheduling) and ``metadata_watcher`` (preemption notices from the metadata server). JAX is
imported only once the actor has set the device environment: nothing heavy here."""
