"""Pure decisions: frozen observations in, typed decision values out. Standard library only;
time is passed in, randomness is passed in, nothing here touches Ray, JAX, files or clocks."""
