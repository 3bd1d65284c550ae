"""Helpers shared by the test suite: real servers on loopback ports, waiting with deadlines."""
