"""A local TPU-like Ray cluster for trying the production path (`ray job submit`) on one machine."""
