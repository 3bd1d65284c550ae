"""UndoLog server: the engine, its stores, the HTTP proxy, the CLI and the demo tools."""

__version__ = "0.1.0"
