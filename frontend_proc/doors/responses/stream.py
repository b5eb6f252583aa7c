"""The Responses API's numbered stream of events: created, in_progress, each output item added, its deltas and
done, then completed (or incomplete)."""

from __future__ import annotations

from cllm.core.errors import ApiError
from frontend_proc.chat.reply import CALL, CONTENT, REASONING, Blocks, Reply
from frontend_proc.chat.tool_parser import ToolCallDelta
from frontend_proc.core.generation import Choice, Generation
from frontend_proc.core.state import ModelState
from frontend_proc.doors.responses.output import finish, output_item
from frontend_proc.doors.responses.store import ResponseStore
from frontend_proc.http import lifecycle
from frontend_proc.http.errors import error_body
from frontend_proc.http.sse import sse_event

PATH = "/v1/responses"
_DELTA = {
    REASONING: "response.reasoning_text.delta",
    CONTENT: "response.output_text.delta",
    CALL: "response.function_call_arguments.delta",
}


class Items(Blocks):
    """Output items, each as output_item.added (and a content part), its deltas, the done events; numbered."""

    def __init__(self, rid: str):
        super().__init__()
        self.rid = rid
        self.seq = 0
        self.output: list[dict] = []
        self.texts: list[str] = []  # of the open item

    def ev(self, type_: str, **fields) -> bytes:
        self.seq += 1
        return sse_event(type_, {"type": type_, "sequence_number": self.seq - 1, **fields})

    def open(self, kind: str, call: ToolCallDelta | None) -> list[bytes]:
        index = len(self.output)
        new = output_item(self.rid, index, kind, "", "in_progress", call)
        if kind == CONTENT:
            new["content"] = []
        self.output.append(new)
        out = [self.ev("response.output_item.added", output_index=index, item=new)]
        if kind == CONTENT:
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            out.append(
                self.ev(
                    "response.content_part.added", item_id=new["id"], output_index=index, content_index=0, part=part
                )
            )
        return out

    def delta(self, kind: str, text: str) -> list[bytes]:
        if not text:
            return []
        self.texts.append(text)
        ids = {"item_id": self.output[-1]["id"], "output_index": len(self.output) - 1}
        if kind == CONTENT:
            return [self.ev(_DELTA[kind], **ids, content_index=0, delta=text, logprobs=[])]
        return [self.ev(_DELTA[kind], **ids, **({"content_index": 0} if kind == REASONING else {}), delta=text)]

    def close(self) -> list[bytes]:
        index, item = len(self.output) - 1, self.output[-1]
        text = "".join(self.texts)
        self.texts.clear()
        ids = {"item_id": item["id"], "output_index": index}
        if item["type"] == "function_call":
            item.update(arguments=text, status="completed")
            out = [self.ev("response.function_call_arguments.done", **ids, name=item["name"], arguments=text)]
        elif item["type"] == "reasoning":
            item["content"] = [{"type": "reasoning_text", "text": text}]
            out = [self.ev("response.reasoning_text.done", **ids, content_index=0, text=text)]
        else:
            item.update(output_item(self.rid, index, CONTENT, text, "completed"))
            out = [
                self.ev("response.output_text.done", **ids, content_index=0, text=text, logprobs=[]),
                self.ev("response.content_part.done", **ids, content_index=0, part=item["content"][0]),
            ]
        return [*out, self.ev("response.output_item.done", output_index=index, item=item)]


class Stream(lifecycle.Stream):
    """created, in_progress, per item added/deltas/done, then completed (or incomplete)."""

    def __init__(
        self,
        st: ModelState,
        store: ResponseStore,
        gen: Generation,
        reply: Reply,
        response: dict,
        conversation: list[dict],
    ):
        self.st, self.store, self.gen, self.reply, self.response, self.conversation = (
            st,
            store,
            gen,
            reply,
            response,
            conversation,
        )
        self.items = Items(response["id"])

    def start(self) -> bytes:
        ev, response = self.items.ev, self.response
        return ev("response.created", response=response) + ev("response.in_progress", response=response)

    def piece(self, choice: Choice, text: str | None) -> bytes:
        return b"".join(self.items.feed(self.reply.feed(text)))

    def end(self) -> bytes:
        items = self.items
        out = items.end()
        if not any(
            o["type"] in ("message", "function_call") for o in items.output
        ):  # every response has a message, unless it calls tools
            out += items.open(CONTENT, None) + items.close()
        finish(self.st, self.store, self.response, self.gen, items.output, self.conversation)
        out.append(items.ev(f"response.{self.response['status']}", response=self.response))
        return b"".join(out)

    def error(self, e: ApiError) -> bytes:
        detail = error_body(PATH, e).error
        return self.items.ev("error", code=detail.code, message=detail.message, param=detail.param)
