"""Framework integrations: `undolog_sdk.integrations.<framework>`.

Each module imports its framework, which is an optional extra (`pip install 'undolog[langgraph]'`);
importing `undolog_sdk` (or this package) never imports a framework.
"""
