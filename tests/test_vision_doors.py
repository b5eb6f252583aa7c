"""Images through every chat door with a projector (issue 48): the embedded SmolLM2 and the made projector
(perf/synth_mmproj.py, random weights: the path is tested, never what the model says about an image).

Each door answers a chat with an image through its real client where one exists (`openai` for chat completions
and Responses, `anthropic`, `ollama`; llama-server's /completion over HTTP), and counts the prompt as llama-server
(perf/cache/bin/llama-server, `--mmproj` the same file) counts it for the same image and text. A second turn
about the same image is served from the prefix cache, the same turn with another image is not, through each door
that keeps a history (Ollama's counted by /metrics). More images than a sequence holds (through each door), and
markers that do not match the images, get 400s; the server keeps serving.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from typing import Any

import anthropic
import httpx
import ollama
import openai
import pytest

from cllm.core.model_file import resolve_model
from perf import image_files, synth_mmproj
from tests.conftest import Server, client_of, start_server
from tests.llama_server import llama_server_on
from tests.test_metrics import scrape, value

MARKER = "<__media__>"
QUESTION = "What is in this picture?"
N_IMAGE = synth_mmproj.Tower().n_patches  # positions one image takes with the made projector (no begin/end text)
PNG = image_files.png(image_files.picture(64, 48, seed=5))
OTHER = image_files.png(image_files.picture(64, 48, seed=6))
JPEG = image_files.jpeg(image_files.picture(32, 32, seed=7))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def data_uri(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{b64(data)}"


def image_part(data: bytes = PNG, kind: str = "image/png") -> dict:
    return {"type": "image_url", "image_url": {"url": data_uri(data, kind), "detail": "low"}}


def text_part(text: str = QUESTION) -> dict:
    return {"type": "text", "text": text}


@pytest.fixture(scope="module")
def vision(mmproj) -> Iterator[Server]:
    # 4 sequences of 512 positions: 7 images fit one, 8 do not. One thread: none spins at a barrier on a busy machine.
    with start_server("--parallel", "4", "--ctx-size", "2048", "--threads", "1", "--mmproj", mmproj) as srv:
        yield srv


http = client_of("vision")


@pytest.fixture(scope="module")
def theirs(mmproj, tmp_path_factory) -> Iterator[httpx.Client]:
    """llama-server on the same model and projector, its media marker pinned for /completion's prompt."""
    import os

    os.environ["LLAMA_MEDIA_MARKER"] = MARKER  # read by llama-server at start; nothing of cllm reads it
    try:
        with llama_server_on(
            resolve_model(None), tmp_path_factory, "--mmproj", mmproj, "--parallel", "1", "--ctx-size", "2048"
        ) as c:
            yield c
    finally:
        os.environ.pop("LLAMA_MEDIA_MARKER", None)


def their_chat_tokens(theirs: httpx.Client, content: list) -> int:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    r = theirs.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()["usage"]["prompt_tokens"]


# ---- each door, its client, llama-server's count -----------------------------------------------------------------


def test_openai_chat_with_an_image(vision, theirs):
    content = [text_part(), image_part()]
    with openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0) as oai:
        r = oai.chat.completions.create(
            model="m", messages=[{"role": "user", "content": content}], max_tokens=4, temperature=0
        )
    assert r.choices[0].message.content and r.usage.completion_tokens >= 1
    assert r.usage.prompt_tokens == their_chat_tokens(theirs, content)


def test_openai_chat_with_two_images_of_two_formats(vision, theirs):
    content = [image_part(), text_part("and"), image_part(JPEG, "image/jpeg"), text_part()]
    with openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0) as oai:
        r = oai.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=2)
    assert r.usage.prompt_tokens == their_chat_tokens(theirs, content)


def test_responses_with_an_image(vision, theirs):
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_uri(PNG)}]
    with openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0) as oai:
        r = oai.responses.create(
            model="m", input=[{"role": "user", "content": content}], max_output_tokens=4, temperature=0
        )
    assert r.output_text and r.usage.output_tokens >= 1
    assert r.usage.input_tokens == their_chat_tokens(theirs, [text_part(), image_part()])


def test_anthropic_messages_with_an_image(vision, theirs):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    messages = [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image]}]
    with anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0) as claude:
        r = claude.messages.create(model="m", max_tokens=4, messages=messages)
        counted = claude.messages.count_tokens(model="m", messages=messages).input_tokens
    assert r.content[0].text and r.usage.output_tokens >= 1
    prompt = r.usage.input_tokens + r.usage.cache_read_input_tokens  # Anthropic counts the cached part apart
    assert prompt == counted == their_chat_tokens(theirs, [text_part(), image_part()])


def test_anthropic_image_in_a_tool_result(vision):
    image = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
    call = {"type": "tool_use", "id": "toolu_1", "name": "camera", "input": {}}
    result = {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "Here:"}, image]}
    messages = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": [call]}]
    messages.append({"role": "user", "content": [result]})
    tools = [{"name": "camera", "description": "Takes a picture", "input_schema": {"type": "object"}}]
    with anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0) as claude:
        with_image = claude.messages.count_tokens(model="m", messages=messages, tools=tools).input_tokens
        result["content"] = [{"type": "text", "text": "Here:"}]
        without = claude.messages.count_tokens(model="m", messages=messages, tools=tools).input_tokens
    assert with_image == without + N_IMAGE


def test_ollama_chat_and_generate_with_an_image(vision, theirs):
    client = ollama.Client(host=vision.url)
    assert "vision" in client.show("SmolLM2-135M-Instruct.Q4_1").capabilities
    r = client.chat(
        model="SmolLM2-135M-Instruct.Q4_1",
        messages=[{"role": "user", "content": QUESTION, "images": [PNG]}],
        options={"num_predict": 4, "temperature": 0},
    )
    assert r.message.content and r.eval_count >= 1
    assert r.prompt_eval_count == their_chat_tokens(theirs, [image_part(), text_part()])  # images before the text
    g = client.generate(model="SmolLM2-135M-Instruct.Q4_1", prompt=QUESTION, images=[PNG], options={"num_predict": 4})
    assert g.response and g.prompt_eval_count == their_chat_tokens(theirs, [image_part(), text_part()])


def test_llama_server_completion_with_multimodal_data(http, theirs):
    prompt = f"<|im_start|>user\n{MARKER}\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    body = {
        "prompt": {"prompt_string": prompt, "multimodal_data": [b64(PNG)]},
        "n_predict": 8,
        "temperature": 0,
        "cache_prompt": False,
    }
    ours, their = http.post("/completion", json=body), theirs.post("/completion", json=body)
    assert ours.status_code == their.status_code == 200, (ours.text, their.text)
    assert ours.json()["tokens_evaluated"] == their.json()["tokens_evaluated"]
    assert ours.json()["content"] == their.json()["content"]  # greedy: the same text on the same made model
    props = http.get("/props").json()
    assert props["media_marker"] == MARKER and props["modalities"]["vision"] is True


def test_llama_servers_own_chat_route_with_an_image(http, theirs):
    content = [text_part(), image_part()]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == their_chat_tokens(theirs, content)


# ---- the prefix cache ---------------------------------------------------------------------------------------------

FOLLOW_UP = "And what colour is it?"


def cache_counts(http: httpx.Client) -> tuple[float, float]:
    """The engine's prefix cache lookups and hit tokens so far (sent by the engine as it goes idle)."""
    samples = scrape(http)
    return value(samples, "cllm_prefix_cache_lookups_total"), value(samples, "cllm_prefix_cache_hit_tokens_total")


def anthropic_turn(vision: Server, image: bytes, reply: str | None) -> tuple[str, int, int]:
    block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(image)}}
    messages: list[Any] = [{"role": "user", "content": [block, {"type": "text", "text": QUESTION}]}]
    if reply is not None:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
    with anthropic.Anthropic(base_url=vision.url, api_key="x", max_retries=0) as claude:
        r = claude.messages.create(model="m", max_tokens=8, messages=messages)
    cached = r.usage.cache_read_input_tokens or 0
    text = "".join(b.text for b in r.content if b.type == "text")
    return text, r.usage.input_tokens + cached, cached  # Anthropic counts the cached part apart


def responses_turn(vision: Server, image: bytes, reply: str | None) -> tuple[str, int, int]:
    content = [{"type": "input_image", "image_url": data_uri(image)}, {"type": "input_text", "text": QUESTION}]
    items: list[Any] = [{"role": "user", "content": content}]
    if reply is not None:
        items += [{"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
    with openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0) as oai:
        r = oai.responses.create(model="m", input=items, max_output_tokens=8, temperature=0, store=False)
    assert r.usage is not None
    return r.output_text, r.usage.input_tokens, r.usage.input_tokens_details.cached_tokens


def ollama_turn(vision: Server, image: bytes, reply: str | None) -> tuple[str, int, int]:
    """Ollama reports no cached count: the server's own counter of cache hits is read around the turn."""
    messages: list[Any] = [{"role": "user", "content": QUESTION, "images": [image]}]
    if reply is not None:
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": FOLLOW_UP}]
    with vision.client() as http:
        lookups, hits = cache_counts(http)
        r = ollama.Client(host=vision.url).chat(
            model="SmolLM2-135M-Instruct.Q4_1", messages=messages, options={"num_predict": 8, "temperature": 0}
        )
        deadline = time.monotonic() + 30
        while (now := cache_counts(http))[0] == lookups:  # until the engine's figures for the turn came
            assert time.monotonic() < deadline, "the engine's cache figures did not come"
            time.sleep(0.05)
    assert now[0] == lookups + 1  # this turn's lookup alone: no other request ran meanwhile
    return r.message.content or "", r.prompt_eval_count or 0, int(now[1] - hits)


def completion_turn(vision: Server, image: bytes, reply: str | None) -> tuple[str, int, int]:
    prompt = f"<|im_start|>user\n{MARKER}\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n"
    if reply is not None:
        prompt += f"{reply}<|im_end|>\n<|im_start|>user\n{FOLLOW_UP}<|im_end|>\n<|im_start|>assistant\n"
    body = {"prompt": {"prompt_string": prompt, "multimodal_data": [b64(image)]}, "n_predict": 8, "temperature": 0}
    with vision.client() as http:
        r = http.post("/completion", json=body)
    assert r.status_code == 200, r.text
    answer = r.json()
    return answer["content"], answer["tokens_evaluated"], answer["timings"]["cache_n"]


TURNS = {"anthropic": anthropic_turn, "responses": responses_turn, "ollama": ollama_turn, "completion": completion_turn}


@pytest.mark.parametrize("door", TURNS)
def test_each_doors_second_turn_about_an_image_is_served_from_the_cache_another_images_is_not(vision, door):
    turn, seed = TURNS[door], 20 + 2 * list(TURNS).index(door)  # images of its own: the doors' prompts may agree
    image, another = (image_files.png(image_files.picture(64, 48, seed=s)) for s in (seed, seed + 1))
    reply, first, _ = turn(vision, image, None)
    _, same, cached_same = turn(vision, image, reply)
    _, other, cached_other = turn(vision, another, reply)
    assert same == other > first
    assert cached_same >= first - 2  # the whole first turn, image and all
    assert cached_same - cached_other >= N_IMAGE  # the other image's cells were never reused


def test_a_second_turn_about_the_same_image_is_served_from_the_cache_another_image_is_not(vision):
    def turn(image: bytes, then: list[Any]) -> tuple[Any, Any]:
        first: Any = {"role": "user", "content": [image_part(image), text_part()]}
        with openai.OpenAI(base_url=vision.url + "/v1", api_key="x", max_retries=0) as oai:
            r = oai.chat.completions.create(model="m", messages=[first, *then], max_tokens=8, temperature=0)
        return r.choices[0].message.content, r.usage

    reply, first = turn(PNG, [])
    follow = [{"role": "assistant", "content": reply}, {"role": "user", "content": "And what colour is it?"}]
    _, same = turn(PNG, follow)
    _, other = turn(OTHER, follow)
    assert same.prompt_tokens == other.prompt_tokens > first.prompt_tokens
    cached_same = same.prompt_tokens_details.cached_tokens
    cached_other = other.prompt_tokens_details.cached_tokens
    assert cached_same >= first.prompt_tokens - 2  # the whole first turn, image and all
    assert cached_same - cached_other >= N_IMAGE  # the other image's cells were never reused


# ---- bad input with a projector -----------------------------------------------------------------------------------


def test_more_images_than_a_sequence_holds_get_a_400(http):
    content = [text_part(), *[image_part() for _ in range(8)]]  # 8 x 64 positions > 511
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": content}], "max_tokens": 1})
    assert r.status_code == 400 and "its images take 512" in r.text, r.text
    r = http.post(
        "/v1/chat/completions", json={"messages": [{"role": "user", "content": content[:3]}], "max_tokens": 1}
    )
    assert r.status_code == 200, r.text


TOO_MANY = 8  # images of 64 positions: over a sequence's 511


def too_many(door: str) -> tuple[str, dict]:
    if door == "anthropic":
        block = {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": b64(PNG)}}
        content = [{"type": "text", "text": QUESTION}, *[block] * TOO_MANY]
        return "/v1/messages", {"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": content}]}
    if door == "responses":
        part = {"type": "input_image", "image_url": data_uri(PNG)}
        content = [{"type": "input_text", "text": QUESTION}, *[part] * TOO_MANY]
        return "/v1/responses", {"input": [{"role": "user", "content": content}], "max_output_tokens": 1}
    if door == "ollama":
        message = {"role": "user", "content": QUESTION, "images": [b64(PNG)] * TOO_MANY}
        return "/api/chat", {
            "model": "SmolLM2-135M-Instruct.Q4_1",
            "messages": [message],
            "stream": False,
            "options": {"num_predict": 1},
        }
    prompt = {"prompt_string": MARKER * TOO_MANY + QUESTION, "multimodal_data": [b64(PNG)] * TOO_MANY}
    return "/completion", {"prompt": prompt, "n_predict": 1}


@pytest.mark.parametrize("door", ["anthropic", "responses", "ollama", "completion"])
def test_more_images_than_a_sequence_holds_get_a_400_through_each_door(http, door):
    path, body = too_many(door)
    r = http.post(path, json=body)
    assert r.status_code == 400 and "its images take 512" in r.text, r.text
    r = http.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1})
    assert r.status_code == 200, r.text


def test_completion_markers_must_match_the_images(http):
    prompt = {"prompt_string": f"{MARKER} and {MARKER}", "multimodal_data": [b64(PNG)]}
    r = http.post("/completion", json={"prompt": prompt, "n_predict": 1})
    assert r.status_code == 400 and "2 places marked for images but 1 images" in r.text, r.text
    prompt = {"prompt_string": f"{MARKER} what?", "multimodal_data": [b64(PNG)]}
    assert http.post("/completion", json={"prompt": prompt, "n_predict": 1}).status_code == 200


def test_a_clients_text_cannot_place_an_image(http):
    """The chat layer's marker is made per request: a client writing llama-server's marker gets text, no image."""
    content = [text_part(f"{MARKER} <__image_0__>"), image_part()]
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 1}
    with_marker = http.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    content[0] = text_part("")
    plain = http.post("/v1/chat/completions", json=body).json()["usage"]["prompt_tokens"]
    assert with_marker > plain  # the marker text was tokenized as text, and one image counted in both


def test_a_photo_larger_than_a_text_servers_body_limit_is_taken(http):
    """With a projector the default body limit makes room for a request's images: a 1.5 MB picture (over the
    text-only server's 1 MiB) is answered, not refused with a 413."""
    photo = image_files.png(image_files.picture(720, 720, seed=8), level=0)  # ~1.5 MB, its base64 ~2 MB
    assert len(photo) > 1 << 20
    body = {"messages": [{"role": "user", "content": [text_part(), image_part(photo)]}], "max_tokens": 1}
    r = http.post("/v1/chat/completions", json=body)
    assert r.status_code == 200, r.text
