"""The rerank routes (`--rerank`) on a made reranker (perf/synth_reranker.py: a tiny Qwen3 with a classification
head, random weights): llama.cpp's scores of llama-server's prompts, llama-server's answer, the same scores and
ranking as llama-server's own, bad input, a model without a head, and decoding streams beside a rerank batch."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import llama_cpp as L
import numpy as np
import pytest

from cllm.core.protocol import Embed
from perf import synth_reranker
from tests.conftest import start_server, wait_idle
from tests.llama_server import llama_server_on, refused

QUERY = "What is the capital of France?"
DOCS = [
    "Paris is the capital and largest city of France.",
    "Bananas are yellow and grow in bunches.",
    "The Eiffel Tower stands in Paris.",
    "Quarterly earnings rose by five percent.",
    "Berlin is the capital of Germany.",
    "A recipe for lemon cake with three eggs.",
]
ROUTES = ("/v1/rerank", "/rerank", "/reranking", "/v1/reranking")


@pytest.fixture(scope="session")
def reranker() -> str:
    """The made reranker with Qwen3-Reranker's rerank template, cached in perf/cache/models."""
    return synth_reranker.cached()


@pytest.fixture(scope="session")
def plain_reranker() -> str:
    """The made reranker without a template: BOS query EOS SEP document EOS, as BGE's."""
    return synth_reranker.cached(plain=True)


@pytest.fixture(scope="module")
def rr(reranker) -> Iterator[httpx.Client]:
    with start_server("--model", reranker, "--rerank", "--parallel", "2", "--ctx-size", "1024") as srv:
        with srv.client() as c:
            yield c


def ranked(client: httpx.Client, route: str = "/v1/rerank", **body) -> dict:
    r = client.post(route, json={"query": QUERY, "documents": DOCS, **body})
    assert r.status_code == 200, r.text
    return r.json()


def scores_of(reply: dict) -> dict[int, float]:
    return {r["index"]: r["relevance_score"] for r in reply["results"]}


def head_scores(model: str, prompts: list[str]) -> list[float]:
    """llama.cpp's rank pooling on each prompt alone, in a context of its own: the scores to expect."""
    m = L.llama_model_load_from_file(model.encode(), L.llama_model_default_params())
    vocab = L.llama_model_get_vocab(m)
    p = L.llama_context_default_params()
    p.embeddings, p.pooling_type = True, L.LLAMA_POOLING_TYPE_RANK
    p.n_ctx = p.n_batch = p.n_ubatch = 512
    p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_DISABLED
    ctx = L.llama_init_from_model(m, p)
    out = []
    try:
        for text in prompts:
            data = text.encode()
            buf = (L.llama_token * 512)()
            n = L.llama_tokenize(vocab, data, len(data), buf, 512, False, True)  # as the template's text is
            assert n > 0 and L.llama_decode(ctx, L.llama_batch_get_one(buf, n)) == 0
            out.append(L.llama_get_embeddings_seq(ctx, 0)[0])
            L.llama_memory_clear(L.llama_get_memory(ctx), True)
    finally:
        L.llama_free(ctx)
        L.llama_model_free(m)
    return out


def test_scores_are_the_heads_on_llama_servers_prompt(rr, reranker):
    """Each score is llama.cpp's classification head on the pair's prompt built from the file's rerank template,
    whatever else shares the decode; the results are ranked best first."""
    reply = ranked(rr)
    prompts = [synth_reranker.RERANK_TEMPLATE.replace("{query}", QUERY).replace("{document}", d) for d in DOCS]
    expected = head_scores(reranker, prompts)
    got = scores_of(reply)
    assert [got[i] for i in range(len(DOCS))] == pytest.approx(expected, abs=1e-5)
    assert [r["index"] for r in reply["results"]] == sorted(range(len(DOCS)), key=lambda i: -expected[i])
    assert max(expected) - min(expected) > 0.05  # the made head tells the documents apart
    assert reply["object"] == "list" and reply["usage"]["prompt_tokens"] == reply["usage"]["total_tokens"] > 0


def test_the_four_routes_and_cohere_jina_and_tei_fields(rr):
    whole = ranked(rr)
    for route in ROUTES[1:]:
        assert ranked(rr, route)["results"] == whole["results"]
    top = ranked(rr, top_n=2, return_documents=True)["results"]
    assert top == [{**r, "document": {"text": DOCS[r["index"]]}} for r in whole["results"][:2]]
    objects = ranked(rr, documents=[{"text": d} for d in DOCS], top_n=100)
    assert objects["results"] == whole["results"]
    assert all("document" not in r for r in objects["results"])
    tei = rr.post("/rerank", json={"query": QUERY, "texts": DOCS, "return_text": True}).json()
    assert [(t["index"], t["score"], t["text"]) for t in tei] == [
        (r["index"], r["relevance_score"], DOCS[r["index"]]) for r in whole["results"]
    ]


def test_llamaindex_jina_reranker_gets_cllms_ranking(rr):
    """LlamaIndex's JinaRerank (llama-index-postprocessor-jinaai-rerank), unchanged but for its base_url, as a RAG
    pipeline runs it after retrieval: the nodes come back in cllm's order with cllm's scores, top_n of them."""
    from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
    from llama_index.postprocessor.jinaai_rerank import JinaRerank

    nodes = [NodeWithScore(node=TextNode(id_=f"doc-{i}", text=d), score=0.0) for i, d in enumerate(DOCS)]
    got = {
        top_n: JinaRerank(base_url=f"{rr.base_url}/v1", top_n=top_n, api_key="unused").postprocess_nodes(
            nodes, QueryBundle(QUERY)
        )
        for top_n in (3, len(DOCS) + 4)
    }
    whole = [(r["index"], r["relevance_score"]) for r in ranked(rr)["results"]]
    for top_n, back in got.items():
        assert [(n.node.node_id, n.node.get_content(), n.score) for n in back] == [
            (f"doc-{i}", DOCS[i], score) for i, score in whole[:top_n]
        ]


def test_bad_input_is_a_400_naming_the_field(rr):
    def bad(field: str, route: str = "/v1/rerank", **body) -> None:
        r = rr.post(route, json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["param"] == field, r.text

    bad("query", documents=DOCS)
    bad("query", query="", documents=DOCS)
    bad("query", query="word " * 600, documents=DOCS)  # one decode holds --batch-size (512) tokens
    bad("documents", query=QUERY)
    bad("documents", query=QUERY, documents=[])
    bad("documents", query=QUERY, documents=["x"] * 1001)
    bad("documents[1]", query=QUERY, documents=["a", "word " * 600])
    bad("documents[0]", query=QUERY, documents=[3])
    bad("top_n", query=QUERY, documents=DOCS, top_n=0)
    refused(rr.post("/rerank", json={"documents": DOCS}), 400, "query")
    assert ranked(rr)["results"]
    wait_idle(rr)


def test_documents_reranked_are_counted(rr):
    def counted() -> float:
        for line in rr.get("/metrics").text.splitlines():
            if line.startswith("cllm_reranked_documents_total{"):
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    before = counted()
    ranked(rr, top_n=1)
    assert counted() == before + len(DOCS)


def test_listed_in_the_openapi_document(rr):
    paths = rr.get("/openapi.json").json()["paths"]
    assert all(route in paths for route in ROUTES)
    assert "relevance_score" in str(rr.get("/openapi.json").json()["components"]["schemas"]["RerankResult"])


def test_a_server_without_rerank_answers_501(http):
    refused(http.post("/rerank", json={"query": QUERY, "documents": DOCS}), 501, "--rerank")
    assert http.post("/v1/rerank", json={"query": QUERY, "documents": DOCS}).status_code == 501


def test_a_model_without_a_classification_head_is_refused_at_start():
    with pytest.raises(RuntimeError, match="has no classification head"):
        start_server("--rerank", "--parallel", "1", "--ctx-size", "256")


def test_rank_and_embeddings_requests_share_the_queue_one_kind_a_step(reranker):
    """A step decodes inputs of one kind, the oldest request's: both finish, each with its own numbers."""
    from cllm.core.config import ServeConfig
    from engine_proc.engine import LLMEngine

    eng = LLMEngine(reranker, ServeConfig(parallel=1, ctx_size=256, batch_size=64, rerank=True))
    try:
        tokens = [[1, 2, 3, 4], [5, 6, 7], [8, 9]]
        kinds = []
        eng.embed(Embed(1, tokens, rank=True))
        eng.embed(Embed(2, tokens))
        eng.embed(Embed(3, tokens[:1], rank=True))
        sent = []
        while eng.has_work():
            for result in eng.step():
                kinds.append({m.id in (1, 3) for m in result.embeddings})
                sent += result.embeddings
        assert all(len(k) <= 1 for k in kinds)
        got = {m.id: m.vectors for m in sent}
        scores = np.frombuffer(got[1], np.float32)
        assert scores.shape == (3,) and np.all((scores > 0) & (scores < 1))  # P(yes), Qwen3's softmax
        assert np.frombuffer(got[3], np.float32)[0] == pytest.approx(scores[0], abs=1e-6)
        assert np.frombuffer(got[2], np.float32).shape == (3 * eng.embedder.dim,)
    finally:
        eng.close()


def steps_beside_a_decode(engine, msg: Embed) -> list[tuple[bool, int]]:
    """Each step's (whether the decoding sequence got a token, inputs of ``msg`` it scored or embedded)."""
    engine.embed(msg)
    width = 1 if msg.rank else engine.embedder.dim
    steps = []
    while any(j.id == msg.id for j in engine.embedder.jobs):
        decoded, n = False, 0
        for result in engine.step():
            decoded |= any(o.id == 1 and o.token is not None for o in result.outputs)
            n += sum(len(m.vectors) // (4 * width) for m in result.embeddings if m.id == msg.id)
        steps.append((decoded, n))
    return steps


def test_a_rerank_batch_delays_a_decoding_stream_as_an_embeddings_batch_does(reranker):
    """32 rerank prompts of ~90 tokens beside a decoding sequence, 128-token steps: every step decodes the
    sequence's token beside one prompt (a quarter of the budget, one prompt at least), as for embeddings of the
    same tokens, rather than the sequence waiting for all 32."""
    from cllm.core.config import ServeConfig
    from cllm.core.protocol import SamplingParams, Submit
    from engine_proc.engine import LLMEngine
    from frontend_proc.core.tokenizer import Tokenizer

    tok = Tokenizer(reranker)
    prompts = [tok.rerank_prompt("rivers", f"Document {i}. The river runs past the old mill.") for i in range(32)]
    tok.close()
    assert all(64 < len(p) <= 128 for p in prompts)
    eng = LLMEngine(reranker, ServeConfig(parallel=2, ctx_size=1024, batch_size=128, rerank=True))
    try:
        eng.add(Submit(1, prompts[0][:20], SamplingParams(max_tokens=500, temperature=0, ignore_eos=True)))
        for _ in eng.step():  # the prompt: the sequence decodes from the next step on
            pass
        ranked = steps_beside_a_decode(eng, Embed(2, prompts, rank=True))
        embedded = steps_beside_a_decode(eng, Embed(3, prompts))
        assert ranked == embedded == [(True, 1)] * 32
    finally:
        eng.close()


# ---- beside llama-server ----------------------------------------------------------------


@pytest.mark.parametrize("plain", [False, True], ids=["template", "plain"])
def test_the_same_scores_and_ranking_as_llama_server(reranker, plain_reranker, plain, tmp_path_factory):
    """With the file's rerank template and without (cllm started with `--pooling rank` then, llama-server's other
    name for `--rerank`). Without flash attention, as cllm scores, llama-server's scores are cllm's to the last bit
    printed; with it (llama-server's default on CPUs) they move by up to ~1e-3 (1.1e-3 seen on the plain file)."""
    model = plain_reranker if plain else reranker
    args = ("--parallel", "2", "--ctx-size", "1024")
    with (
        start_server("--model", model, *(("--pooling", "rank") if plain else ("--rerank",)), *args) as srv,
        srv.client() as ours,
    ):
        mine = ranked(ours, "/rerank")
        a = scores_of(mine)
        for flash, tolerance in (("off", 1e-6), ("auto", 3e-3)):
            with llama_server_on(model, tmp_path_factory, "--rerank", "--flash-attn", flash, *args) as theirs:
                their = ranked(theirs, "/rerank")
                b = scores_of(their)
                assert a.keys() == b.keys() == set(range(len(DOCS)))
                assert [a[i] for i in range(len(DOCS))] == pytest.approx(
                    [b[i] for i in range(len(DOCS))], abs=tolerance
                )
                # The order, where llama.cpp's precision can tell it (no two scores within it).
                assert np.diff(sorted(b.values())).min() > 2 * tolerance, b
                assert [r["index"] for r in mine["results"]] == [r["index"] for r in their["results"]]
                assert mine["usage"] == their["usage"]
                top = [r["index"] for r in ranked(theirs, "/v1/rerank", top_n=2)["results"]]
                assert [r["index"] for r in ranked(ours, "/v1/rerank", top_n=2)["results"]] == top
