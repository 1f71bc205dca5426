"""Drives Spool's MCP server with the official Python SDK's client (`mcp`
from PyPI): tools listed, a run started that asks a question, answered,
listed, its transcript read, and its resource subscribed (`resources/subscribe` on
a handshake-era connection, `subscriptions/listen` on 2026-07-28) and a
change notified.

    python drive_spool.py MODE http URL [TOKEN]
    python drive_spool.py MODE stdio PROGRAM ARG...

MODE is the SDK's connect mode: `legacy` (the initialize handshake,
2025-11-25) or `auto` (probes `server/discover`, 2026-07-28, and falls
back to the handshake). The agent behind the server must ask one question
(`ask_human`), then answer "done", then "again". Prints what it checked;
exits 1 on the first disagreement.
"""

import asyncio
import sys

import anyio
import httpx2
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

EXPECTED_TOOLS = {"start_run", "send_message", "respond", "get_run", "list_runs", "cancel_run"}


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


async def main() -> None:
    mode, transport, *rest = sys.argv[1:]
    updated = anyio.Event()

    async def on_message(message) -> None:
        root = getattr(message, "root", message)
        if getattr(root, "method", None) == "notifications/resources/updated":
            updated.set()

    if transport == "http":
        url = rest[0]
        headers = {"Authorization": f"Bearer {rest[1]}"} if len(rest) > 1 else {}
        server = streamable_http_client(url, http_client=httpx2.AsyncClient(headers=headers, timeout=60))
    else:
        server = StdioServerParameters(command=rest[0], args=rest[1:])

    async with Client(server, mode=mode, message_handler=on_message) as client:
        version = getattr(client, "protocol_version", None) or getattr(client.session, "protocol_version", None)
        print(f"connected, protocol {version}", flush=True)
        tools = await client.list_tools()
        names = {tool.name for tool in tools.tools}
        check(EXPECTED_TOOLS <= names, f"tools/list offers {sorted(EXPECTED_TOOLS)}: {sorted(names)}")
        check(all(tool.output_schema for tool in tools.tools), "every tool has an output schema")

        started = await client.call_tool("start_run", {"text": "hello from the SDK"})
        run = started.structured_content
        check(not started.is_error and run["state"] == "waiting", f"start_run waits for the question: {run}")
        check(run["pending"]["kind"] == "question", f"the run asks a question: {run['pending']}")
        run_id = run["run_id"]

        answered = await client.call_tool(
            "respond", {"run_id": run_id, "turn_id": run["pending"]["turn_id"], "text": "blue"}
        )
        done = answered.structured_content
        check(done["state"] == "completed" and done["response"] == "done", f"respond completes the turn: {done}")

        listed = (await client.call_tool("list_runs", {})).structured_content
        check(any(r["run_id"] == run_id for r in listed["runs"]), "list_runs lists the run")

        got = (await client.call_tool("get_run", {"run_id": run_id})).structured_content
        check(got["state"] == "completed", f"get_run reads it: {got}")

        missing = await client.call_tool("get_run", {"run_id": "run_does_not_exist"})
        check(missing.is_error and missing.structured_content["code"] == "run_not_found", "an unknown run is run_not_found")

        resources = await client.list_resources()
        uris = {str(r.uri) for r in resources.resources}
        check(f"spool://runs/{run_id}" in uris and f"spool://runs/{run_id}/events" in uris, "resources/list names the run's two resources")
        transcript = await client.read_resource(f"spool://runs/{run_id}")
        text = transcript.contents[0].text
        check("hello from the SDK" in text and "blue" in text, f"the transcript holds the exchange: {text!r}")
        events = await client.read_resource(f"spool://runs/{run_id}/events")
        check('"turn_started"' in events.contents[0].text, "the journal resource holds the run's events")

        if mode == "legacy":
            await client.subscribe_resource(f"spool://runs/{run_id}")
            await client.call_tool("send_message", {"run_id": run_id, "text": "once more"})
            with anyio.fail_after(30):
                await updated.wait()
            check(True, "a subscribed run's change is notified")
        else:
            uri = f"spool://runs/{run_id}"
            async with client.listen(resource_subscriptions=[uri, "spool://nothing"]) as sub:
                honored = list(sub.honored.resource_subscriptions or [])
                check(honored == [uri], f"subscriptions/listen honors the run's URI only: {honored}")
                await client.call_tool("send_message", {"run_id": run_id, "text": "once more"})
                with anyio.fail_after(30):
                    event = await sub.__anext__()
                check(getattr(event, "uri", None) == uri, f"a listened run's change is notified: {event}")
    print("all checks passed", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
