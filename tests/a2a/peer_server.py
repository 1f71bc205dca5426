"""An A2A agent written with the official Python SDK (`a2a-sdk` from
PyPI, its Starlette routes under uvicorn), for Spool's `a2a_send` tool to
call:

    python peer_server.py PORT LOG [SLOW_SECONDS]

- a message "ask" makes the task ask "Which size?" (input-required); the
  answer that follows completes it with "size: ANSWER";
- a message "slow" waits SLOW_SECONDS before answering (to be killed in);
- any other message completes at once with "peer: TEXT".

Each message it receives is appended to LOG as a JSON line with its
`messageId`, so a test can tell a resent message from a new one. Prints
"listening" once it serves.
"""

import asyncio
import json
import sys

import uvicorn
from starlette.applications import Starlette

from a2a.helpers.proto_helpers import new_task_from_user_message, new_text_message
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.request_handlers import DefaultRequestHandler
from a2a.server.routes import create_agent_card_routes, create_jsonrpc_routes
from a2a.server.tasks import InMemoryTaskStore, TaskUpdater
from a2a.types import AgentCapabilities, AgentCard, AgentInterface, AgentSkill, Part, Role


class Peer(AgentExecutor):
    def __init__(self, log, slow):
        self.log = log
        self.slow = slow

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        text = context.get_user_input()
        with open(self.log, "a") as log:
            log.write(json.dumps({"message_id": context.message.message_id, "text": text}) + "\n")
        asked = context.current_task is not None
        if not asked:
            # A new task is published before its first status update.
            task = new_task_from_user_message(context.message)
            task.id, task.context_id = context.task_id, context.context_id
            await event_queue.enqueue_event(task)
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.start_work()
        if text == "ask":
            await updater.requires_input(
                new_text_message("Which size?", context_id=context.context_id, task_id=context.task_id)
            )
            return
        if text == "slow":
            await asyncio.sleep(self.slow)
        answer = f"size: {text}" if asked else f"peer: {text}"
        await updater.add_artifact([Part(text=answer)], name="answer")
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = TaskUpdater(event_queue, context.task_id, context.context_id)
        await updater.cancel()


def main():
    port, log = int(sys.argv[1]), sys.argv[2]
    slow = float(sys.argv[3]) if len(sys.argv) > 3 else 30.0
    url = f"http://127.0.0.1:{port}"
    card = AgentCard(
        name="peer",
        description="A test peer.",
        version="1.0.0",
        supported_interfaces=[AgentInterface(url=f"{url}/", protocol_binding="JSONRPC", protocol_version="1.0")],
        capabilities=AgentCapabilities(streaming=True),
        default_input_modes=["text/plain"],
        default_output_modes=["text/plain"],
        skills=[AgentSkill(id="echo", name="echo", description="Echoes.", tags=["test"])],
    )
    handler = DefaultRequestHandler(
        agent_executor=Peer(log, slow), task_store=InMemoryTaskStore(), agent_card=card
    )
    routes = create_agent_card_routes(card) + create_jsonrpc_routes(handler, rpc_url="/")
    app = Starlette(routes=routes)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)

    async def serve():
        task = asyncio.create_task(server.serve())
        while not server.started:
            await asyncio.sleep(0.02)
        print("listening", flush=True)
        await task

    asyncio.run(serve())


if __name__ == "__main__":
    main()
