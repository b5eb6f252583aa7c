"""Images in the engine (issue 48), on the real llama.cpp: the embedded SmolLM2 with a made projector
(perf/synth_mmproj.py, random weights: the path is tested, not what the model says about an image).

Loading: `--mmproj` makes the engine load the projector and count the positions one image takes; a projector
that cannot serve stops the engine with llama.cpp's reason.
"""

from __future__ import annotations

import pytest

from cllm.core.config import ServeConfig
from cllm.core.images import MAX_REQUEST_BYTES
from cllm.core.launch import REQUEST_RING_BYTES, request_ring_bytes
from cllm.core.model_file import resolve_model
from engine_proc.engine import LLMEngine
from engine_proc.model_runner import ModelLoadError
from perf import image_files as F
from perf import synth_mmproj
from tests.conftest import start_server

N_IMAGE = synth_mmproj.Tower().n_patches  # positions an image takes with the made projector (it adds no text)


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory) -> str:
    width = synth_mmproj.text_embedding_width(resolve_model(None))
    return synth_mmproj.write(str(tmp_path_factory.mktemp("vision") / "mmproj.gguf"), width)


def test_the_engine_loads_the_projector_and_counts_an_images_positions(mmproj):
    engine = LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=1024, mmproj=mmproj))
    try:
        assert (engine.info.mmproj, engine.info.image_tokens) == (mmproj, N_IMAGE)
        image = engine.vision.image(F.png(F.picture(200, 100)))
        try:
            with engine.vision.tokenize([image], add_special=False) as chunks:
                assert chunks.n_pos == engine.info.image_tokens  # a real image takes what the probe counted
        finally:
            image.close()
    finally:
        engine.close()


def test_a_projector_that_cannot_serve_stops_the_engine(tmp_path):
    wide = synth_mmproj.write(str(tmp_path / "wide.gguf"), 640)
    with pytest.raises(ModelLoadError, match="n_embd = 640"):
        LLMEngine(resolve_model(None), ServeConfig(parallel=2, ctx_size=1024, mmproj=wide))


def test_the_request_ring_has_room_for_images_only_with_a_projector(mmproj):
    assert request_ring_bytes(ServeConfig()) == REQUEST_RING_BYTES
    assert request_ring_bytes(ServeConfig(mmproj=mmproj)) > REQUEST_RING_BYTES + MAX_REQUEST_BYTES


def test_serve_with_mmproj_reports_the_projector(mmproj):
    with start_server("--parallel", "2", "--ctx-size", "1024", "--mmproj", mmproj) as srv, srv.client() as http:
        info = http.get("/model/info").json()["data"]
        assert (info["mmproj"], info["image_tokens"]) == (mmproj, N_IMAGE)
    with start_server("--parallel", "2", "--ctx-size", "1024") as srv, srv.client() as http:
        info = http.get("/model/info").json()["data"]
        assert (info["mmproj"], info["image_tokens"]) == ("", 0)
