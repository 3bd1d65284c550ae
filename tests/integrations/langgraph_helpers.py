"""Helpers of the LangGraph tests: a scripted chat model (no network), the ReAct loop built by
hand around a `ToolNode`, and the approval steps a person takes."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.graph.state import CompiledStateGraph
from langgraph.prebuilt import ToolNode, tools_condition

if TYPE_CHECKING:  # the agent processes import these helpers, and never the server
    from tests.proxy.conftest import ProxyHarness


class ScriptedModel(BaseChatModel):
    """A chat model that answers the n-th model turn of a conversation with `script[n]`.

    It reads the turn from the messages, not from a counter: a resumed or restarted graph that
    asks again at the same point of the conversation gets the same answer.
    """

    script: list[AIMessage]

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        turn = sum(isinstance(m, AIMessage) for m in messages)
        return ChatResult(generations=[ChatGeneration(message=self.script[turn])])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        return self._generate(messages, stop)

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self


def calls_tools(*calls: tuple[str, dict[str, Any]]) -> AIMessage:
    """A model turn that calls tools; ids are unique, as a real model's are."""
    return AIMessage(
        "",
        tool_calls=[
            {"name": name, "args": args, "id": f"call_{uuid.uuid4().hex[:8]}"}
            for name, args in calls
        ],
    )


def agent_graph(
    model: ScriptedModel, tools: list[Any], checkpointer: InMemorySaver | None = None
) -> CompiledStateGraph[Any, Any, Any, Any]:
    """The ReAct loop by hand: a model node and a `ToolNode`, with a checkpointer."""

    async def call_model(state: MessagesState) -> dict[str, Any]:
        return {"messages": [await model.ainvoke(state["messages"])]}

    builder = StateGraph(MessagesState)
    builder.add_node("agent", call_model)
    builder.add_node("tools", ToolNode(tools))
    builder.add_edge(START, "agent")
    builder.add_conditional_edges("agent", tools_condition)
    builder.add_edge("tools", "agent")
    return builder.compile(checkpointer=checkpointer or InMemorySaver())


def thread() -> dict[str, Any]:
    return {"configurable": {"thread_id": str(uuid.uuid4())}}


def approve(proxy: ProxyHarness, approval_id: str, verb: str = "approve") -> None:
    with proxy.client(proxy.approver_key) as c:
        decided = c.post(f"/approvals/{approval_id}/{verb}", json={"reason": "no"})
    assert decided.status_code == 200, decided.text


def tool_messages(result: dict[str, Any]) -> list[ToolMessage]:
    return [m for m in result["messages"] if isinstance(m, ToolMessage)]
