"""The demo tool server: an in-memory upstream the proxy calls in demos, tests and benchmarks."""
