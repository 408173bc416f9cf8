"""LangGraph's prebuilt ReAct agent, with LangChain's ChatOpenAI pointed at a real forkv serve
process (demo:qwen3:tiny), completes a two-tool task: tool_choice forces a call to `add`, then
one to `multiply` on add's result, then an answer; both tools run, in that order."""

from __future__ import annotations

import pytest

pytest.importorskip("langgraph")
pytest.importorskip("langchain_openai")

from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.prebuilt import create_react_agent
from server_proc import TINY, shared_server

CALLS: list[tuple[str, int, int]] = []


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    CALLS.append(("add", a, b))
    return a + b


@tool
def multiply(a: int, b: int) -> int:
    """Multiply two integers."""
    CALLS.append(("multiply", a, b))
    return a * b


@pytest.mark.slow  # three requests with ~1K-token prompts (the tools block) on a server
@pytest.mark.filterwarnings("ignore:create_react_agent has been moved")  # what the issue names
def test_react_agent_completes_a_two_tool_task():
    url = shared_server(*TINY)
    llm = ChatOpenAI(model="demo:qwen3:tiny", base_url=f"{url}/v1", api_key="unused",
                     max_tokens=150, temperature=1.0, seed=1, max_retries=0, timeout=300)
    tools = [add, multiply]
    # The tool each turn must call, by how many tool results the conversation holds: a random
    # model follows no instructions, so tool_choice does the planning; the last turn answers.
    plan = ["add", "multiply", "none"]

    def model(state, runtime):
        done = sum(isinstance(m, ToolMessage) for m in state["messages"])
        return llm.bind_tools(tools, tool_choice=plan[min(done, 2)],
                              parallel_tool_calls=False)

    agent = create_react_agent(model, tools)
    out = agent.invoke({"messages": [("user", "What is (2 + 3) * 4?")]},
                       {"recursion_limit": 8})
    messages = out["messages"]
    results = [m for m in messages if isinstance(m, ToolMessage)]
    assert [m.name for m in results] == ["add", "multiply"]
    assert [c[0] for c in CALLS] == ["add", "multiply"]
    assert all(m.status == "success" for m in results)
    assert int(results[0].content) == CALLS[0][1] + CALLS[0][2]
    calls = [c for m in messages if isinstance(m, AIMessage) for c in m.tool_calls]
    assert all(set(c["args"]) == {"a", "b"} for c in calls)  # no invented arguments
    final = messages[-1]
    assert isinstance(final, AIMessage) and not final.tool_calls
