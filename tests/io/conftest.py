"""Shared settings of the reader tests (the sample files live in tests/data/topologies)."""
