"""MCP (KVVIZ_MCP, on by default on a Space): the named endpoints are tools whose schema says what each
parameter means, listed at Gradio's schema route, and ``/memory`` answers through the MCP protocol."""

from __future__ import annotations

import ast
import json
import urllib.request

import anyio
import pytest

from kvviz.settings import Settings
from tests.server import start_app, stop_app

TOOLS = {
    "memory": "/memory",
    "generate": "/generate",
    "evict": "/evict",
    "blocks": "/blocks",
    "break_cache": "/break_cache",
    "serve_sim": "/serve_sim",
}


@pytest.mark.parametrize(
    "space, raw, on",
    [(None, None, False), ("someone/kvviz", None, True), ("someone/kvviz", "0", False), (None, "1", True)],
)
def test_mcp_is_on_by_default_on_a_space_only(monkeypatch, space, raw, on):
    for name, value in (("SPACE_ID", space), ("KVVIZ_MCP", raw)):
        if value is None:
            monkeypatch.delenv(name, raising=False)
        else:
            monkeypatch.setenv(name, value)
    assert Settings.from_env().mcp is on


@pytest.fixture(scope="module")
def mcp_app(tmp_path_factory):
    app = start_app(tmp_path_factory.mktemp("mcp-app"), {"KVVIZ_MCP": "1"})
    yield app
    stop_app(app.proc)


def schema(app) -> dict[str, dict]:
    with urllib.request.urlopen(app.url + "gradio_api/mcp/schema", timeout=30) as resp:
        return {tool["meta"]["endpoint_name"]: tool for tool in json.load(resp)}


@pytest.mark.slow
def test_the_endpoints_are_tools_with_every_parameter_described(mcp_app):
    tools = schema(mcp_app)
    for endpoint in TOOLS:
        assert endpoint in tools, f"/{endpoint} is not an MCP tool: {sorted(tools)}"
        tool = tools[endpoint]
        assert tool["meta"]["mcp_type"] == "tool" and tool["description"]
        props = tool["inputSchema"]["properties"]
        undescribed = [name for name, p in props.items() if not p.get("description")]
        assert props and not undescribed, f"/{endpoint}: parameters without a description: {undescribed}"
    units = tools["memory"]["inputSchema"]["properties"]
    assert "GB" in units["gpu_mem_gb"]["description"] and "TB/s" in units["bandwidth_tbps"]["description"]


@pytest.mark.slow
def test_memory_answers_through_the_mcp_protocol(mcp_app):
    from gradio_client import Client
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    name = schema(mcp_app)["memory"]["name"]
    args = {"config": "Llama-3-70B", "context": 8192, "batch": 4, "kv_dtype": "bf16"}

    async def call():
        async with (
            streamablehttp_client(mcp_app.url + "gradio_api/mcp/") as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            listed = {tool.name for tool in (await session.list_tools()).tools}
            return listed, await session.call_tool(name, args)

    listed, result = anyio.run(call)
    assert name in listed and not result.isError
    out = ast.literal_eval(result.content[0].text)  # Gradio's MCP server sends a dict as its repr
    direct = Client(mcp_app.url, verbose=False).predict(*args.values(), api_name="/memory")
    assert out["bytes_per_token"] == direct["bytes_per_token"] == 2 * 80 * 8 * 128 * 2  # Llama-3-70B, bf16
    assert out["total_bytes"] == direct["total_bytes"] == 4 * 8192 * out["bytes_per_token"]


@pytest.mark.slow
def test_two_mcp_sessions_each_run_a_model_tool_at_once(mcp_app):
    """Gradio's MCP bridge sends every queued tool call through one client with one session hash: without a
    session per MCP caller, the second caller's run was refused as "your previous generation"."""
    from mcp import ClientSession
    from mcp.client.streamable_http import streamablehttp_client

    name = schema(mcp_app)["generate"]["name"]
    args = {"prompt_text": "Tell me a long story about the sea.", "max_new_tokens": 64, "chat": True}
    results: dict[str, object] = {}

    async def one(session_id: str):
        async with (
            streamablehttp_client(mcp_app.url + "gradio_api/mcp/", headers={"mcp-session-id": session_id}) as (
                read,
                write,
                _,
            ),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            results[session_id] = await session.call_tool(name, args)

    async def both():
        async with (  # a first call makes the bridge's one client (two first calls at once may make two)
            streamablehttp_client(mcp_app.url + "gradio_api/mcp/") as (read, write, _),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            memory = await session.call_tool(schema(mcp_app)["memory"]["name"], {"config": "Llama-3-8B"})
            assert not memory.isError
        async with anyio.create_task_group() as tasks:
            for session_id in ("mcp-one", "mcp-two"):
                tasks.start_soon(one, session_id)

    anyio.run(both)
    for session_id, result in results.items():
        text = result.content[0].text
        assert not result.isError and "still running" not in text, (session_id, text[:300])
        assert ast.literal_eval(text)["generated_tokens"] >= 1
