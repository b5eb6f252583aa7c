"""Images through a served engine (issue 48): the embedded SmolLM2 with a made projector (perf/synth_mmproj.py,
random weights: the path, not what the model says), over the OpenAI door.

The engine loads `--mmproj` and reports it in /model/info. What only the engine can find (an image whose header
passes the frontend's checks, but that stb_image cannot decode) gets a 400 with the engine's reason, streamed or
not, and the server keeps serving images; a conversation about an image goes on after a restart with --cache-dir,
its image's positions served from the files.
"""

from __future__ import annotations

import base64

from perf import image_files as F
from perf import synth_mmproj
from tests.conftest import start_server

N_IMAGE = synth_mmproj.Tower().n_patches  # positions one image takes with the made projector
ARGS = ("--parallel", "2", "--ctx-size", "2048", "--threads", "1")


def chat(data: bytes, history: list[dict] | None = None, **extra) -> dict:
    uri = "data:image/png;base64," + base64.b64encode(data).decode()
    first = {
        "role": "user",
        "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": uri}}],
    }
    return {"model": "m", "max_tokens": 8, "temperature": 0, "messages": [first, *(history or [])], **extra}


def test_an_image_only_the_engine_cannot_decode_gets_a_400_and_the_server_goes_on(mmproj):
    bad = F.png_raw(64, 48, b"\x00garbage, not a zlib stream")  # its header and CRCs pass; stb_image cannot inflate it
    with start_server(*ARGS, "--mmproj", mmproj) as srv, srv.client() as http:
        info = http.get("/model/info").json()["data"]  # the engine loaded the projector and counted an image
        assert (info["mmproj"], info["image_tokens"]) == (mmproj, N_IMAGE)
        r = http.post("/v1/chat/completions", json=chat(bad))
        assert r.status_code == 400 and "could not be decoded" in r.json()["error"]["message"], r.text
        r = http.post("/v1/chat/completions", json=chat(bad, stream=True))
        assert r.status_code == 200 and "could not be decoded" in r.text and "[DONE]" not in r.text
        r = http.post("/v1/chat/completions", json=chat(F.png(F.picture(64, 48, seed=1))))
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] > N_IMAGE


def test_a_conversation_about_an_image_goes_on_after_a_restart(mmproj, tmp_path):
    """The next turn asked before the restart (its first turn's cells, the image's among them, still in the stream
    that made them) and after it (from the file): the same reply, logprobs and all."""
    args = (*ARGS, "--mmproj", mmproj, "--cache-dir", str(tmp_path / "kv"))
    image = F.png(F.picture(64, 48, seed=2))
    system = [{"role": "system", "content": "You describe pictures carefully and briefly. " * 20}]
    with start_server(*args) as srv, srv.client() as http:
        body = chat(image)
        body["messages"] = system + body["messages"]
        r = http.post("/v1/chat/completions", json=body).json()
        first = r["usage"]
        assert first["prompt_tokens_details"]["cached_tokens"] == 0 and first["prompt_tokens"] > 128 + N_IMAGE
        body["messages"] += [r["choices"][0]["message"], {"role": "user", "content": "And its colours?"}]
        body |= {"logprobs": True, "top_logprobs": 2}
        before = http.post("/v1/chat/completions", json=body).json()
    with start_server(*args) as srv, srv.client() as http:
        r = http.post("/v1/chat/completions", json=body).json()
        # the whole first prompt, the image's positions in the middle of it, came from the file
        assert r["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["prompt_tokens"]
    assert r["choices"] == before["choices"]
