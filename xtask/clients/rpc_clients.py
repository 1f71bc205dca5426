"""Drives `spool serve`'s JSON-RPC framings with clients nobody here wrote.

Python's `websockets` (from PyPI) drives a run over /ws with submit.run and
run.respond, a legacy {"t": "run"} message and a subscription; `curl -N`
reads the run's SSE (/events) and NDJSON (/stream) streams. Every wait is
for a message, under a timeout that fails the check.

usage: python rpc_clients.py HOST:PORT
"""

import json
import subprocess
import sys

from websockets.sync.client import connect

PATIENCE = 20  # seconds a client waits for any one message


def check(condition, what):
    if not condition:
        raise SystemExit(f"rpc clients: {what}")


def until_answer(ws, request_id):
    """Messages until the answer to `request_id`: (notifications, answer)."""
    notifications = []
    while True:
        message = json.loads(ws.recv(timeout=PATIENCE))
        if "method" in message:
            notifications.append(message)
        elif message.get("id") == request_id:
            return notifications, message


def kinds(notifications):
    return [n["params"]["spool.kind"] for n in notifications if n["method"] == "events.append"]


def websocket(addr):
    with connect(f"ws://{addr}/ws", open_timeout=PATIENCE) as ws:
        ws.send(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "submit.run",
                            "params": {"text": "hello from python"}}))
        events, answer = until_answer(ws, 1)
        check(answer["result"]["state"] == "completed", f"submit.run completed: {answer}")
        check(answer["result"]["response"] == "echo: hello from python", f"the echo: {answer}")
        seen = kinds(events)
        check(seen[0] == "run:start" and "run:end" in seen, f"the turn's events: {seen}")
        run = answer["result"]["run_id"]
        for event in events:
            trace = event["params"]["traceId"]
            check(len(trace) == 32 and int(trace, 16) > 0, f"an OTLP trace id: {trace}")

        ws.send(json.dumps({"t": "run", "text": "legacy"}))
        while True:
            message = json.loads(ws.recv(timeout=PATIENCE))
            check("jsonrpc" not in message, f"a legacy reply: {message}")
            if message["t"] == "result":
                check(message["result"]["response"] == "echo: legacy", f"{message}")
                break
            check(message["t"] == "event", f"a legacy event: {message}")

        ws.send(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "state.snapshot",
                            "params": {"run_id": run}}))
        _, snapshot = until_answer(ws, 2)
        check(len(snapshot["result"]["messages"]) == 2, f"the snapshot: {snapshot}")

        ws.send(json.dumps({"jsonrpc": "2.0", "id": 3, "method": "rpc.nope"}))
        _, refused = until_answer(ws, 3)
        check(refused["error"]["code"] == -32601, f"method not found: {refused}")
        return run


def curl(addr, path):
    """`curl -N` on a run's stream, read until the turn's `run:end`."""
    command = ["curl", "-sS", "-N", "--max-time", str(PATIENCE), f"http://{addr}{path}"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as reader:
        seen = []
        for line in reader.stdout:
            line = line.strip()
            if path.startswith("/events"):
                if not line.startswith("data: "):
                    continue
                line = line[len("data: "):]
            message = json.loads(line)
            check(message["jsonrpc"] == "2.0", f"an envelope: {message}")
            seen.append(message["params"]["spool.kind"])
            if seen[-1] == "run:end":
                reader.kill()
                return seen
        raise SystemExit(f"rpc clients: {path} ended early after {seen} (curl {reader.wait()})")


def main():
    addr = sys.argv[1]
    run = websocket(addr)
    print(f"rpc clients: websockets drove {run} over /ws (legacy too)")
    for path in (f"/events?run_id={run}", f"/stream?run_id={run}"):
        seen = curl(addr, path)
        check(seen[0] == "run:start", f"{path}: {seen}")
        print(f"rpc clients: curl -N read {len(seen)} events from {path.split('?')[0]}")


if __name__ == "__main__":
    main()
