"""An MCP server written with the official Python SDK (`mcp` from PyPI), for
Spool's MCP tests: a read tool, an idempotent tool, a write tool that
records each execution, a slow tool that reports progress, a tool that
fails, a tool that makes the server exit mid-call, and one that adds a
tool and says so (`notifications/tools/list_changed`).

    python tools_server.py stdio
    python tools_server.py http PORT

Every execution of a tool is appended, one JSON line each, to the file
named by SPOOL_MCP_LOG (when set), so a test can count what really ran.
"""

import asyncio
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

server = MCPServer("spool-test-tools")


def record(tool: str, **fields) -> None:
    path = os.environ.get("SPOOL_MCP_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"tool": tool, **fields}) + "\n")
            log.flush()
            os.fsync(log.fileno())


def first_time(tool: str) -> bool:
    """Whether the log holds one execution of `tool` (this one) only: a
    tool holds its answer back on its first execution, not when a
    recovered run sends the call again."""
    path = os.environ.get("SPOOL_MCP_LOG")
    if not path:
        return True
    with open(path, encoding="utf-8") as log:
        return sum(json.loads(line)["tool"] == tool for line in log) == 1


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def lookup(key: str, hold_seconds: float = 0) -> str:
    """Look a key up (reads only)."""
    record("lookup", key=key)
    if hold_seconds and first_time("lookup"):
        await asyncio.sleep(hold_seconds)
    return f"value of {key}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True))
async def upsert(key: str, value: str, hold_seconds: float = 0) -> str:
    """Set a key to a value (the same call twice changes nothing more)."""
    record("upsert", key=key, value=value)
    if hold_seconds and first_time("upsert"):
        await asyncio.sleep(hold_seconds)
    return f"{key} = {value}"


@server.tool()
async def write_note(text: str, hold_seconds: float = 0) -> str:
    """Append a note (a write: every call adds one). It records the write
    first, then holds the answer back for `hold_seconds`; the `hold_seconds`
    of the read and idempotent tools hold their first execution only."""
    record("write_note", text=text)
    if hold_seconds:
        await asyncio.sleep(hold_seconds)
    return f"noted: {text}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def slow(seconds: float, ctx: Context) -> str:
    """Wait, reporting progress every tenth of the time."""
    record("slow", seconds=seconds)
    try:
        for step in range(10):
            await ctx.report_progress(step, 10, f"step {step}")
            await asyncio.sleep(seconds / 10)
    except asyncio.CancelledError:
        record("slow_cancelled")
        raise
    return "done waiting"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
async def grow(name: str, ctx: Context) -> str:
    """Adds a read tool called `name` and tells the client its tools changed."""
    record("grow", name=name)

    def added() -> str:
        return f"{name} answers"

    server.add_tool(added, name=name, annotations=ToolAnnotations(readOnlyHint=True))
    await ctx.session.send_tool_list_changed()
    return f"added {name}"


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def fail(reason: str) -> str:
    """Always fails, with the reason."""
    record("fail", reason=reason)
    raise ToolError(f"failed on purpose: {reason}")


@server.tool(annotations=ToolAnnotations(readOnlyHint=True))
def exit_now(code: int = 3) -> str:
    """Makes the server exit in the middle of the call."""
    record("exit_now", code=code)
    print("exiting mid-call, as asked", file=sys.stderr, flush=True)
    os._exit(code)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
