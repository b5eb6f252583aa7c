"""A chat turn below every chat door: a ChatRequest made prompt tokens, a grammar and a Generation.

A door reads its body into a frontend_proc.chat.request.ChatRequest; here its
tools are planned (frontend_proc.chat.tools), its messages rendered with the
model's chat template, its JSON output or tool calls made a grammar
(frontend_proc.core.grammar), its sampling parameters completed, and the request
sent down the one generation path (frontend_proc.core.generation). The reply is
read back with a frontend_proc.chat.reply.Reply, which ChatPrompt makes, and
answered whole or streamed with frontend_proc.http.lifecycle.
"""

from __future__ import annotations

import msgspec

from cllm.core.errors import invalid
from cllm.core.image_grid import prompt_images
from cllm.core.images import MAX_REQUEST_BYTES
from frontend_proc.chat import images
from frontend_proc.chat.reasoning import HARMONY_TOKENS, is_harmony, splitter_factory
from frontend_proc.chat.reply import Reply
from frontend_proc.chat.request import ChatRequest, Fields
from frontend_proc.chat.tools import ToolError, ToolFormat, ToolPlan, generic_messages, plan
from frontend_proc.core import generation
from frontend_proc.core.generation import Generation
from frontend_proc.core.output import GrammarOutput, JsonOutput, check_ignore_eos, output_grammar
from frontend_proc.core.sampling import check_logit_bias
from frontend_proc.core.state import ModelState
from frontend_proc.core.template import ChatTemplate, ChatTemplateError
from frontend_proc.core.tokenizer import Tokenizer


def tool_plan(req: ChatRequest, template: ChatTemplate, vocab) -> ToolPlan:
    """The plan for the request's tools (with none, or tool_choice none, a plan that adds nothing)."""
    if not req.tools and req.tool_choice not in ("auto", "none"):
        raise invalid("tool_choice asks for a tool call, but the request has no tools", "tool_choice")
    fmt = ToolFormat.detect(template.source, template.renders_tools)
    try:
        return plan(req.tools, req.tool_choice, req.parallel_tool_calls, fmt, vocab)
    except ToolError as e:
        raise invalid(str(e), e.param if e.index is None else req.fields.tool_schema.format(e.index)) from None


def render(template: ChatTemplate, req: ChatRequest, tool_plan: ToolPlan, marker: str = images.SHOWN_MARKER) -> str:
    """The prompt text: the messages with the template (marker where each image goes), the tools as the plan says."""
    messages = [
        {**m, "content": images.joined(m["content"], marker)} if isinstance(m.get("content"), list) else m
        for m in req.messages
    ]
    if not tool_plan.format.native:
        messages = generic_messages(messages, tool_plan.system_text, template.renders_tool_role)
    try:
        return template.render(messages, tools=tool_plan.template_tools, context=req.template_context())
    except ChatTemplateError as e:
        raise invalid(str(e), req.fields.messages) from None


class ChatPrompt:
    """A rendered conversation: its tokens and images, and how to read the reply."""

    def __init__(
        self, st: ModelState, text: str, tool_plan: ToolPlan, marker: str = "", found: list[bytes] | None = None
    ):
        """marker, found: where the images' marker is in text, and their checked bytes."""
        if found:
            self.tokens, self.images = images.split(st.tokenizer.encode, text, marker, found)
            text = text.replace(marker, "")  # the reasoning splitter reads the prompt's text
        else:
            self.tokens, self.images = st.tokenizer.encode(text), []
        # The positions the prompt takes (what its usage counts): each image its projector's.
        self.positions = len(self.tokens) + (prompt_images(generation.engine_info(st), self.images) if found else 0)
        self.tool_plan = tool_plan
        harmony = is_harmony(st.chat_template.source)
        self._new_splitter = (
            splitter_factory(text, harmony, tool_plan.parse) if st.config.reasoning_format == "auto" else None
        )
        # The reply's text must show the control tokens it is read by: a tool-call opener, harmony's markers.
        shown = shown_tokens(tool_plan, st.tokenizer)
        self.shown = (shown | st.tokenizer.control_tokens(HARMONY_TOKENS)) if harmony else shown

    def reply(self) -> Reply:
        """A reader for one reply (one per choice); thinking stays in the text with --reasoning-format none."""
        return Reply(self._new_splitter() if self._new_splitter is not None else None, self.tool_plan)


async def prompt(st: ModelState, req: ChatRequest) -> ChatPrompt:
    """The request's prompt, with its images (image_bytes)."""
    tools = tool_plan(req, st.chat_template, st.tokenizer.vocab)
    parts = [p for m in req.messages if isinstance(m.get("content"), list) for p in m["content"]]
    if not (found := [p for p in parts if isinstance(p, images.Image)]):
        return ChatPrompt(st, render(st.chat_template, req, tools), tools)
    data = await image_bytes(st, found)
    marker = images.new_marker()
    return ChatPrompt(st, render(st.chat_template, req, tools, marker), tools, marker, data)


async def image_bytes(st: ModelState, found: list[images.Image]) -> list[bytes]:
    """The images' bytes, fetched (where the operator allows URLs) and checked, each a 400 naming what is wrong
    with it; a model that takes no images refuses them with a 400 naming --mmproj."""
    data = [images.checked(await images.fetch(image, st.config)) for image in found]
    if (total := sum(map(len, data))) > MAX_REQUEST_BYTES:  # what the engine's request ring has room for
        raise invalid(f"the request's images are {total} bytes, over the limit of {MAX_REQUEST_BYTES}", found[0].param)
    if not generation.engine_info(st).mmproj:
        raise invalid(
            "this model takes no images: start the server with --mmproj FILE (the model's multimodal projector)",
            found[0].param,
        )
    return data


async def start(st: ModelState, req: ChatRequest, chat: ChatPrompt) -> Generation:
    """Generate the replies down the one path."""
    generation.engine_info(st)
    check_logit_bias(req.sampling, st.tokenizer.n_vocab)
    grammar, triggers = constraint(st, req.output, chat.tool_plan, req.sampling.ignore_eos, req.fields)
    sampling = msgspec.structs.replace(req.sampling, grammar=grammar, grammar_triggers=triggers)
    fields = req.fields
    return await generation.start(
        st,
        [chat.tokens],
        sampling,
        n=req.n,
        stops=req.stops,
        stream=req.stream,
        prompt_param=fields.messages,
        limit_param=fields.max_tokens,
        shown=chat.shown,
        images=chat.images,
    )


def constraint(
    st: ModelState, output: JsonOutput | GrammarOutput | None, plan: ToolPlan | None, ignore_eos: bool, fields: Fields
) -> tuple[str | None, list[str] | None]:
    """The grammar and its triggers: the JSON output's, the client's own, or the tools' (one grammar per sequence)."""
    grammar, triggers = output_grammar(st.tokenizer.vocab, output, fields.output), None
    if plan is not None and plan.grammar is not None:
        if grammar is not None:
            param = "grammar" if type(output) is GrammarOutput else fields.output
            raise invalid(f"{param} cannot be combined with tools unless tool_choice is none", param)
        grammar, triggers = plan.grammar, plan.triggers
    check_ignore_eos(grammar, ignore_eos)
    return grammar, triggers


def shown_tokens(tool_plan: ToolPlan, tokenizer: Tokenizer) -> frozenset[int]:
    """The call opener, when it is a control token (Mistral's [TOOL_CALLS]): the text must show it to the parser."""
    opener = tool_plan.format.opener
    token = tokenizer.control_token(opener) if tool_plan.parse and opener else None
    return frozenset(() if token is None else (token,))


def reasoning_tokens(st: ModelState, gen: Generation, text: str) -> int:
    """The tokens of a reply's reasoning text, counted once the reply is over (0, at no cost, without reasoning)."""
    if not text:
        return 0
    return min(len(st.tokenizer.encode(text, add_special=False, parse_special=False)), gen.completion_tokens)
