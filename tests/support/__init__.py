"""Reusable test support (emulators, local servers) shared by every package's tests."""
