"""Adapters that put UndoLog into agent frameworks, one module per framework:
`undolog_sdk.integrations.langgraph`, `.openai_agents`, `.pydantic_ai`, `.llama_index`,
`.semantic_kernel`, `.crewai`.

Each module imports its framework, an optional extra (`pip install 'undolog[<framework>]'`);
importing `undolog_sdk` (or this package) never imports any of them.
"""
