"""Adapters that put UndoLog into agent frameworks, one module per framework.

Each module imports its framework, an optional extra (`pip install 'undolog[<framework>]'`);
importing `undolog_sdk` never imports any of them.
"""
