"""Drives Spool's A2A server with the official Python SDK's client
(`a2a-sdk` from PyPI), over one binding.

    python drive_spool.py SCENARIO URL BINDING [TOKEN] [TASK]

BINDING is `JSONRPC` or `HTTP+JSON`; URL is the agent's base (the card is
found at URL/.well-known/agent-card.json). SCENARIO is one of:

- `basics`: the agent echoes (`echo` engine). A blocking send, the same
  message sent again, a follow-up in its context, get with a history
  length, list by context, a streaming send, and the spec's errors.
- `conversation`: the agent's script asks a question (`ask_human`), then
  an approval (`request_approval`), then answers "painted"; its fourth
  model call streams a long answer slowly. The question and the approval
  are answered with follow-up messages carrying the task id; a second
  task is sent without waiting, subscribed to, and cancelled mid-turn.
- `strict`: the agent echoes. Raw requests over both bindings (BINDING is
  ignored), each answer parsed against the protocol's own message types
  (the SDK's compiled `a2a.proto`) with unknown fields refused, and the
  errors' codes, statuses and `ErrorInfo` reasons checked.
- `push`: the conversation's agent (its first three answers), and push
  notifications to a local receiver: the SDK sends a message with a
  config, lists, gets, makes and deletes configs, and the receiver gets
  every change in order.
- `start`: sends "go" without waiting, subscribes, and prints the task id
  once the answer starts streaming.
- `finish`: subscribes to task TASK and prints its state once it rests.

Prints what it checked; exits 1 on the first disagreement.
"""

import asyncio
import sys
import uuid

import json

import httpx
from google.protobuf import json_format
from a2a.client import ClientConfig, ClientFactory
from a2a.client.errors import A2AClientError
from a2a.helpers.proto_helpers import new_data_message, new_text_message
from a2a.types import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    TaskPushNotificationConfig,
    ListTasksResponse,
    SendMessageResponse,
    StreamResponse,
    Task,
    GetTaskRequest,
    ListTasksRequest,
    Role,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.errors import (
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)


def check(condition, what):
    if not condition:
        print(f"FAILED: {what}", flush=True)
        sys.exit(1)
    print(f"ok: {what}", flush=True)


def user(text, context_id=None, task_id=None, message_id=None):
    message = new_text_message(text, context_id=context_id, task_id=task_id, role=Role.ROLE_USER)
    if message_id:
        message.message_id = message_id
    return message


def state(task):
    return TaskState.Name(task.status.state)


def answer_text(task):
    return "".join(part.text for artifact in task.artifacts for part in artifact.parts)


def status_text(task):
    return "".join(part.text for part in task.status.message.parts)


async def client_for(url, binding, token, streaming):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    http = httpx.AsyncClient(headers=headers, timeout=60)
    config = ClientConfig(
        streaming=streaming,
        supported_protocol_bindings=[binding],
        httpx_client=http,
    )
    return await ClientFactory(config).create_from_url(url)


async def send(client, message, return_immediately=False):
    """The task a non-streaming send answers."""
    request = SendMessageRequest(message=message)
    request.configuration.return_immediately = return_immediately
    events = [event async for event in client.send_message(request)]
    check(len(events) == 1 and events[0].HasField("task"), "a send is answered with a task")
    return events[0].task


async def raises(kind, call, what):
    try:
        await call()
    except kind:
        check(True, what)
        return
    except A2AClientError as error:
        check(False, f"{what}: {type(error).__name__}: {error}")
    check(False, f"{what}: no error")


async def basics(url, binding, token):
    client = await client_for(url, binding, token, streaming=False)
    card = client._card
    bindings = {i.protocol_binding for i in card.supported_interfaces}
    check({"JSONRPC", "HTTP+JSON"} <= bindings, f"the card offers both bindings: {sorted(bindings)}")
    check(card.capabilities.streaming, "the card says it streams")

    message_id = str(uuid.uuid4())
    first = await send(client, user("hello", message_id=message_id))
    check(state(first) == "TASK_STATE_COMPLETED", f"a blocking send answers the finished task: {state(first)}")
    check(answer_text(first) == "echo: hello", f"the answer is the task's artifact: {answer_text(first)!r}")
    check(first.context_id != "", "a message without a context starts one")

    again = await send(client, user("hello, changed", message_id=message_id))
    check(again.id == first.id, "the same messageId sent again answers the same task")

    follow = await send(client, user("more", context_id=first.context_id))
    check(follow.context_id == first.context_id and follow.id != first.id, "a follow-up in the context is a new task in it")
    check(answer_text(follow) == "echo: more", f"the follow-up's answer: {answer_text(follow)!r}")

    got = await client.get_task(GetTaskRequest(id=follow.id, history_length=1))
    check(got.id == follow.id and state(got) == "TASK_STATE_COMPLETED", "GetTask reads the task")
    check(len(got.history) == 1, f"historyLength 1 keeps one message: {len(got.history)}")

    listed = await client.list_tasks(ListTasksRequest(context_id=first.context_id))
    ids = [task.id for task in listed.tasks]
    check(ids == [follow.id, first.id], f"ListTasks by context, newest first, once each: {ids}")
    check(listed.total_size == 2 and listed.next_page_token == "", "one page of two")
    check(all(len(task.artifacts) == 0 for task in listed.tasks), "artifacts are left out unless asked for")
    paged = await client.list_tasks(ListTasksRequest(context_id=first.context_id, page_size=1))
    check([t.id for t in paged.tasks] == [follow.id] and paged.next_page_token != "", "a page of one has a next page")
    rest = await client.list_tasks(
        ListTasksRequest(context_id=first.context_id, page_size=1, page_token=paged.next_page_token)
    )
    check([t.id for t in rest.tasks] == [first.id] and rest.next_page_token == "", "the next page holds the other")

    await raises(TaskNotFoundError, lambda: client.get_task(GetTaskRequest(id="run_nothing.1")), "an unknown task is TaskNotFound")
    await raises(
        TaskNotCancelableError, lambda: client.cancel_task(CancelTaskRequest(id=first.id)), "a finished task is not cancelable"
    )
    await raises(
        UnsupportedOperationError,
        lambda: send(client, user("late", task_id=first.id, context_id=first.context_id)),
        "a message to a finished task is refused",
    )
    await client.close()

    streaming = await client_for(url, binding, token, streaming=True)
    events = [event async for event in streaming.send_message(SendMessageRequest(message=user("stream me")))]
    check(events and events[0].HasField("task"), "a stream starts with the task")
    last = events[-1]
    final = last.status_update.status if last.HasField("status_update") else last.task.status
    check(TaskState.Name(final.state) == "TASK_STATE_COMPLETED", "the stream ends at the completed state")
    chunks = [e.artifact_update for e in events if e.HasField("artifact_update")]
    check(any(c.last_chunk for c in chunks) or answer_text(events[0].task), "the answer arrives as an artifact")
    await raises(
        UnsupportedOperationError,
        lambda: anext(streaming.subscribe(SubscribeToTaskRequest(id=first.id))),
        "subscribing to a finished task is refused",
    )
    await streaming.close()


async def conversation(url, binding, token):
    client = await client_for(url, binding, token, streaming=False)
    asked = await send(client, user("paint the fence"))
    check(state(asked) == "TASK_STATE_INPUT_REQUIRED", f"a question leaves the task input-required: {state(asked)}")
    check("Which color?" in status_text(asked), f"the question is the status message: {status_text(asked)!r}")

    approving = await send(client, user("blue", task_id=asked.id, context_id=asked.context_id))
    check(approving.id == asked.id, "the answer continues the same task")
    check(state(approving) == "TASK_STATE_INPUT_REQUIRED", "then it asks for an approval")
    check("Paint it blue?" in status_text(approving), f"the approval's prompt: {status_text(approving)!r}")

    verdict = new_data_message({"approved": True}, context_id=asked.context_id, task_id=asked.id, role=Role.ROLE_USER)
    done = await send(client, verdict)
    check(state(done) == "TASK_STATE_COMPLETED", f"approved, the task completes: {state(done)}")
    check(answer_text(done) == "painted", f"with its answer: {answer_text(done)!r}")
    texts = [part.text for m in done.history for part in m.parts]
    check(texts[0] == "paint the fence" and "blue" in texts[1], f"the history holds the message and the answers: {texts}")

    slow = await send(client, user("tell me a long story", context_id=asked.context_id), return_immediately=True)
    check(state(slow) in ("TASK_STATE_WORKING", "TASK_STATE_SUBMITTED"), f"returnImmediately answers at once: {state(slow)}")
    await client.close()

    streaming = await client_for(url, binding, token, streaming=True)
    subscription = streaming.subscribe(SubscribeToTaskRequest(id=slow.id))
    first = await anext(subscription)
    check(first.HasField("task") and first.task.id == slow.id, "a subscription starts with the task")
    chunk = None
    async for event in subscription:
        if event.HasField("artifact_update"):
            chunk = event.artifact_update
            break
    check(chunk is not None and not chunk.last_chunk, "the answer streams as artifact chunks")
    cancelled = await streaming.cancel_task(CancelTaskRequest(id=slow.id))
    check(state(cancelled) == "TASK_STATE_CANCELED", f"CancelTask answers the cancelled task: {state(cancelled)}")
    rest = [event async for event in subscription]
    statuses = [TaskState.Name(e.status_update.status.state) for e in rest if e.HasField("status_update")]
    check(statuses and statuses[-1] == "TASK_STATE_CANCELED", f"the subscription ends at canceled: {statuses}")
    await streaming.close()


def strictly(kind, value, what):
    """`value` parsed as the proto message `kind`, unknown fields refused."""
    try:
        parsed = json_format.ParseDict(value, kind(), ignore_unknown_fields=False)
    except json_format.ParseError as error:
        check(False, f"{what} is a valid {kind.__name__}: {error}")
    check(True, f"{what} is a valid {kind.__name__}")
    return parsed


async def strict(url, token):
    headers = {"A2A-Version": "1.0"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:
        card = (await http.get("/.well-known/agent-card.json")).json()
        strictly(AgentCard, card, "the agent card")
        legacy = (await http.get("/.well-known/agent.json")).json()
        check(legacy == card, "the card is served at the older path too")

        def message(text, **extra):
            return {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **extra}}

        sent = await http.post("/a2a/message:send", json=message("hi"))
        check(sent.status_code == 200, f"message:send answers 200: {sent.status_code}")
        check(sent.headers["content-type"] == "application/a2a+json", "HTTP+JSON answers application/a2a+json")
        task = strictly(SendMessageResponse, sent.json(), "message:send's answer").task
        got = await http.get(f"/a2a/tasks/{task.id}", params={"historyLength": 0})
        got = strictly(Task, got.json(), "GET tasks/{id}")
        check(len(got.history) == 0, "historyLength 0 leaves the history out")
        listed = await http.get("/a2a/tasks", params={"contextId": task.context_id, "includeArtifacts": "true"})
        listed = strictly(ListTasksResponse, listed.json(), "GET tasks")
        check(len(listed.tasks) == 1 and len(listed.tasks[0].artifacts) == 1, "includeArtifacts keeps them")
        working = await http.get("/a2a/tasks", params={"status": "TASK_STATE_WORKING", "contextId": task.context_id})
        check(strictly(ListTasksResponse, working.json(), "GET tasks by state").tasks == [], "a state filter leaves others out")

        async with http.stream("POST", "/a2a/message:stream", json=message("stream")) as stream:
            check(stream.headers["content-type"].startswith("text/event-stream"), "message:stream is an event stream")
            items = [json.loads(line[5:]) async for line in stream.aiter_lines() if line.startswith("data:")]
        for n, item in enumerate(items):
            strictly(StreamResponse, item, f"stream item {n}")

        missing = await http.get("/a2a/tasks/run_nothing.1")
        body = missing.json()
        check(missing.status_code == 404, f"an unknown task is 404: {missing.status_code}")
        detail = body["error"]["details"][0]
        check(
            detail["reason"] == "TASK_NOT_FOUND" and detail["domain"] == "a2a-protocol.org"
            and detail["@type"] == "type.googleapis.com/google.rpc.ErrorInfo",
            f"its ErrorInfo: {detail}",
        )
        odd = await http.post("/a2a/message:send", json=message("hi"), headers={"A2A-Version": "0.5"})
        check(
            odd.status_code == 400 and odd.json()["error"]["details"][0]["reason"] == "VERSION_NOT_SUPPORTED",
            f"an unknown A2A-Version is refused: {odd.status_code} {odd.text}",
        )
        push = await http.get(f"/a2a/tasks/{task.id}/pushNotificationConfigs")
        check(push.json() == {"configs": [], "nextPageToken": ""}, f"a task without push configs lists none: {push.text}")
        local = await http.post(f"/a2a/tasks/{task.id}/pushNotificationConfigs", json={"url": "http://127.0.0.1:9/hook"})
        check(
            local.status_code == 400 and local.json()["error"]["details"][0]["reason"] == "INVALID_PARAMS",
            f"a push URL on loopback is refused by default: {local.status_code} {local.text}",
        )

        async def rpc(method, params, extra=None):
            reply = await http.post("/a2a", json={"jsonrpc": "2.0", "id": 7, "method": method, "params": params}, headers=extra or {})
            check(reply.status_code == 200, f"JSON-RPC {method} answers 200")
            return reply.json()

        result = (await rpc("SendMessage", message("rpc")))["result"]
        rpc_task = strictly(SendMessageResponse, result, "SendMessage's result").task
        strictly(Task, (await rpc("GetTask", {"id": rpc_task.id}))["result"], "GetTask's result")
        strictly(ListTasksResponse, (await rpc("ListTasks", {"pageSize": 5}))["result"], "ListTasks' result")
        error = (await rpc("GetTask", {"id": "run_nothing.1"}))["error"]
        check(error["code"] == -32001 and error["data"][0]["reason"] == "TASK_NOT_FOUND", f"TaskNotFound is -32001: {error}")
        error = (await rpc("CancelTask", {"id": rpc_task.id}))["error"]
        check(error["code"] == -32002, f"TaskNotCancelable is -32002: {error}")
        error = (await rpc("SendMessage", message("v"), {"A2A-Version": "2.0"}))["error"]
        check(error["code"] == -32009, f"VersionNotSupported is -32009: {error}")
        error = (await rpc("CreateTaskPushNotificationConfig", {"taskId": rpc_task.id, "url": "http://10.0.0.1/"}))["error"]
        check(error["code"] == -32602, f"a push URL on a private network is refused by default: {error}")
        error = (await rpc("GetTaskPushNotificationConfig", {"taskId": rpc_task.id, "id": "none"}))["error"]
        check(error["code"] == -32001, f"an unknown push config is TaskNotFound: {error}")
        error = (await rpc("NoSuchMethod", {}))["error"]
        check(error["code"] == -32601, f"an unknown method is -32601: {error}")
        error = (await rpc("SendMessage", {"message": {"role": "ROLE_USER", "parts": []}}))["error"]
        check(error["code"] == -32602, f"a message without an id or parts is -32602: {error}")

        legacy = await http.post(
            "/a2a",
            json={"jsonrpc": "2.0", "id": 8, "method": "message/send", "params": {"message": {
                "kind": "message", "messageId": str(uuid.uuid4()), "role": "user", "parts": [{"kind": "text", "text": "old"}]}}},
            headers={"A2A-Version": "0.3"},
        )
        old = legacy.json()["result"]
        check(
            old["kind"] == "task" and old["status"]["state"] == "completed" and old["artifacts"][0]["parts"][0]["kind"] == "text",
            f"a v0.3 method is answered in v0.3's shape: {old}",
        )


async def push(url, binding, token):
    """A local receiver gets the task's changes; the SDK manages the config."""
    received = asyncio.Queue()

    async def serve(reader, writer):
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        headers = {k.lower(): v for k, v in (l.split(": ", 1) for l in lines[1:] if ": " in l)}
        body = await reader.readexactly(int(headers.get("content-length", "0")))
        # Only the first config's posts (the second's go to /second).
        if lines[0].split(" ")[1] == "/hook":
            await received.put((headers, json.loads(body)))
        writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
        await writer.drain()
        writer.close()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    hook = f"http://127.0.0.1:{listener.sockets[0].getsockname()[1]}/hook"
    client = await client_for(url, binding, token, streaming=False)
    check(client._card.capabilities.push_notifications, "the card offers push notifications")
    request = SendMessageRequest(message=user("paint the fence"))
    request.configuration.task_push_notification_config.url = hook
    request.configuration.task_push_notification_config.token = "tok-7"
    events = [event async for event in client.send_message(request)]
    task = events[0].task
    check(state(task) == "TASK_STATE_INPUT_REQUIRED", f"the task asks: {state(task)}")
    headers, body = await asyncio.wait_for(received.get(), 30)
    check(body["statusUpdate"]["taskId"] == task.id, f"the receiver gets the task's change: {body}")
    check(body["statusUpdate"]["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", "its question first")
    check(headers.get("x-a2a-notification-token") == "tok-7", f"with the config's token: {headers}")
    check(headers.get("content-type") == "application/a2a+json", "as application/a2a+json")

    listed = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
    check(len(listed.configs) == 1 and listed.configs[0].url == hook, f"the SDK lists the config: {listed}")
    config_id = listed.configs[0].id
    got = await client.get_task_push_notification_config(GetTaskPushNotificationConfigRequest(task_id=task.id, id=config_id))
    check(got.url == hook and got.task_id == task.id, "and gets it")
    second = TaskPushNotificationConfig(task_id=task.id, id="second", url=hook.replace("/hook", "/second"))
    made = await client.create_task_push_notification_config(second)
    check(made.id == "second", f"a second config is made: {made}")
    await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="second"))
    await client.delete_task_push_notification_config(DeleteTaskPushNotificationConfigRequest(task_id=task.id, id="second"))
    left = await client.list_task_push_notification_configs(ListTaskPushNotificationConfigsRequest(task_id=task.id))
    check([c.id for c in left.configs] == [config_id], "deleting twice leaves the first alone")

    await send(client, user("blue", task_id=task.id, context_id=task.context_id))
    verdict = new_data_message({"approved": True}, context_id=task.context_id, task_id=task.id, role=Role.ROLE_USER)
    await send(client, verdict)
    seen = []
    while not seen or seen[-1] != "TASK_STATE_COMPLETED":
        _, body = await asyncio.wait_for(received.get(), 30)
        seen.append(body["statusUpdate"]["status"]["state"])
    check(
        seen == ["TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_WORKING", "TASK_STATE_COMPLETED"],
        f"every change after, in order, once each: {seen}",
    )
    listener.close()
    await client.close()


async def start(url, binding, token):
    client = await client_for(url, binding, token, streaming=False)
    task = await send(client, user("go"), return_immediately=True)
    await client.close()
    streaming = await client_for(url, binding, token, streaming=True)
    async for event in streaming.subscribe(SubscribeToTaskRequest(id=task.id)):
        if event.HasField("artifact_update"):
            break
    print(f"task: {task.id}", flush=True)
    await streaming.close()


async def finish(url, binding, token, task_id):
    client = await client_for(url, binding, token, streaming=True)
    last = None
    async for event in client.subscribe(SubscribeToTaskRequest(id=task_id)):
        last = event
    got = await client.get_task(GetTaskRequest(id=task_id))
    print(f"state: {state(got)}", flush=True)
    print(f"answer: {answer_text(got)}", flush=True)
    await client.close()


def main():
    scenario, url, binding, *rest = sys.argv[1:]
    token = rest[0] if rest and rest[0] else None
    if scenario == "basics":
        asyncio.run(basics(url, binding, token))
    elif scenario == "conversation":
        asyncio.run(conversation(url, binding, token))
    elif scenario == "push":
        asyncio.run(push(url, binding, token))
    elif scenario == "strict":
        asyncio.run(strict(url, token))
    elif scenario == "start":
        asyncio.run(start(url, binding, token))
    elif scenario == "finish":
        asyncio.run(finish(url, binding, token, rest[1]))
    else:
        sys.exit(f"unknown scenario {scenario}")
    print("done", flush=True)


if __name__ == "__main__":
    main()
