"""What one request may ask, checked in the frontend (no model needed)."""

from __future__ import annotations

import pytest

from cllm.core.config import ServeConfig
from cllm.core.errors import ApiError
from cllm.core.protocol import SamplingParams
from frontend_proc.engine.limits import Limits
from tests.conftest import model_info

INFO = model_info(ctx_size=1024, seq_ctx=512, parallel=2)


def test_defaults_follow_the_sequence_context_and_the_queue():
    limits = Limits.of(ServeConfig(max_waiting=10), INFO)
    assert (limits.prompt_tokens, limits.max_tokens, limits.sequences) == (511, 512, 12)
    assert limits.maxima() == {"max_tokens": 512, "max_completion_tokens": 512}
    limits.check([[1] * 511], 512, 12, "prompt")


def test_max_tokens_caps_a_larger_ask_and_leaves_a_smaller_one():
    limits = Limits.of(ServeConfig(max_tokens=64), INFO)
    assert [limits.capped(SamplingParams(max_tokens=k)).max_tokens for k in (0, 10, 64, 512)] == [0, 10, 64, 64]
    assert Limits.of(ServeConfig(), INFO).capped(SamplingParams(max_tokens=512)).max_tokens == 512


def test_max_prompt_tokens_lowers_but_never_raises_the_limit():
    assert Limits.of(ServeConfig(max_prompt_tokens=100), INFO).prompt_tokens == 100
    assert Limits.of(ServeConfig(max_prompt_tokens=5000), INFO).prompt_tokens == 511


@pytest.mark.parametrize(
    "prompts,max_tokens,n,param,message",
    [
        ([[]], 5, 1, "prompt", "prompt is empty"),
        ([[1] * 512], 5, 1, "messages", "the prompt is 512 tokens; this server takes at most 511"),
        ([[1]], 513, 1, "max_tokens", "max_tokens 513 exceeds the context of one sequence (512)"),
        ([[1], [2]], 5, 7, "n", "14 sequences (n x prompts) exceed the 12 this server takes at once"),
    ],
)
def test_each_limit_is_a_400_that_states_it(prompts, max_tokens, n, param, message):
    with pytest.raises(ApiError) as e:
        Limits.of(ServeConfig(max_waiting=10), INFO).check(
            prompts, max_tokens, n, "messages" if param == "messages" else "prompt"
        )
    assert e.value.status == 400 and e.value.message == message and e.value.param == param
