"""UndoLog server: the engine, its stores, the HTTP proxy, the CLI and the demo tools."""

from importlib import metadata as _metadata

try:  # one source of truth, pyproject's `version`, as installed (also undolog_sdk.__version__)
    __version__ = _metadata.version("undolog")
except _metadata.PackageNotFoundError:  # the sources run without being installed
    __version__ = "0+unknown"
