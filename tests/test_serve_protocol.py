"""Request validation (protocol.py) and the server's text stream: stop strings, held-back text,
characters split across tokens. No server is started."""

import pytest

from specrepro.embedded.protocol import (
    APIError,
    TextStream,
    check_context_length,
    parse_chat,
    parse_completion,
)
from specrepro.embedded.tokenizer import Tokenizer


def test_completion_defaults_follow_vllm():
    req = parse_completion({"model": "m", "prompt": "hi"}, "m")
    assert req.max_tokens == 16 and req.sampling.temperature == 1.0 and req.sampling.top_k == -1
    assert not req.stream and req.stop == [] and not req.return_token_ids
    assert parse_completion({"prompt": [1, 2, 3]}, "m").prompt_token_ids == [1, 2, 3]
    assert parse_completion({"prompt": ["one"]}, "m").prompt == "one"


def test_chat_fields():
    body = {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}]}],
            "reasoning_effort": "none", "max_tokens": 7, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
            "stop": "x", "seed": 3, "top_k": 0, "ignore_eos": True}
    req = parse_chat(body, "m")
    assert req.messages == [{"role": "user", "content": "a"}]
    assert req.chat_template_kwargs == {"enable_thinking": False}
    assert req.max_tokens == 7 and req.include_usage and req.continuous_usage_stats
    assert req.stop == ["x"] and req.sampling.seed == 3 and req.ignore_eos
    # an explicit enable_thinking wins over reasoning_effort; max_completion_tokens over max_tokens
    req = parse_chat({**body, "chat_template_kwargs": {"enable_thinking": True},
                      "max_completion_tokens": 5}, "m")
    assert req.chat_template_kwargs == {"enable_thinking": True} and req.max_tokens == 5
    assert parse_chat({"messages": [{"role": "user", "content": "a"}]}, "m").max_tokens is None
    # vLLM sends usage on every chunk only when the final usage chunk is asked for as well
    req = parse_chat({**body, "stream_options": {"continuous_usage_stats": True}}, "m")
    assert not req.continuous_usage_stats


@pytest.mark.parametrize("body, param", [
    ({"prompt": "x", "max_tokens": -1}, "max_tokens"),
    ({"prompt": "x", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "x", "max_tokens": "ten"}, "max_tokens"),
    ({"prompt": "x", "temperature": -0.5}, "temperature"),
    ({"prompt": "x", "temperature": "hot"}, "temperature"),
    ({"prompt": "x", "top_p": 0}, "top_p"),
    ({"prompt": "x", "top_p": 1.01}, "top_p"),
    ({"prompt": "x", "top_k": -2}, "top_k"),
    ({"prompt": "x", "top_k": 1.5}, "top_k"),
    ({"prompt": "x", "seed": "s"}, "seed"),
    ({"prompt": "x", "model": "other"}, "model"),
    ({"prompt": "x", "n": 2}, "n"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, "stream_options"),
    ({"prompt": "x", "stream": "yes"}, "stream"),
    ({"prompt": "x", "stop": [1]}, "stop"),
    ({"prompt": 5}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": "x", "logprobs": 2}, "logprobs"),
])
def test_completion_rejects(body, param):
    with pytest.raises(APIError) as e:
        parse_completion(body, "m")
    assert e.value.status == 400 and e.value.param == param
    err = e.value.body()["error"]
    assert err["type"] == "BadRequestError" and err["code"] == 400 and err["message"]


@pytest.mark.parametrize("body, param", [
    ({"messages": "hi"}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"content": "x"}]}, "messages"),
    ({"messages": [{"role": "user", "content": 3}]}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}], "reasoning_effort": "huge"},
     "reasoning_effort"),
    ({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []},
     "chat_template_kwargs"),
    ({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": -3},
     "max_completion_tokens"),
])
def test_chat_rejects(body, param):
    with pytest.raises(APIError) as e:
        parse_chat(body, "m")
    assert e.value.param == param


def test_context_length():
    assert check_context_length(10, None, 100) == 90  # chat default: the rest of the context
    assert check_context_length(10, 90, 100) == 90
    with pytest.raises(APIError, match="maximum context length is 100"):
        check_context_length(10, 91, 100)
    with pytest.raises(APIError, match="100 input tokens"):
        check_context_length(100, 1, 100)


@pytest.fixture(scope="module")
def tokenizer(tiny_checkpoint):
    return Tokenizer.load(tiny_checkpoint)


def _stream_out(tok, text: str, stop: list[str], chunk: int) -> tuple[list[str], TextStream]:
    ids = tok.encode(text)
    stream, deltas = TextStream(tok, stop), []
    for i in range(0, len(ids), chunk):
        stopped = stream.add(ids[i:i + chunk])
        deltas.append(stream.delta(finished=stopped))
        if stopped:
            break
    else:
        deltas.append(stream.delta(finished=True))
    return deltas, stream


@pytest.mark.parametrize("chunk", [1, 2, 5])
def test_stop_string_cuts_text_and_never_leaks(tokenizer, chunk):
    text = "def alpha(beta):\n    return beta + 1  # STOP here, never seen\n"
    deltas, stream = _stream_out(tokenizer, text, ["STOP", "never"], chunk)
    assert "".join(deltas) == "def alpha(beta):\n    return beta + 1  # "
    assert stream.stop_reason == "STOP"


def test_text_that_may_begin_a_stop_string_is_held_back(tokenizer):
    stream = TextStream(tokenizer, ["</answer>"])
    stream.add(tokenizer.encode("x = 1 </ans"))
    assert stream.delta(finished=False) == "x = 1 "  # "</ans" could begin the stop string
    assert not stream.add(tokenizer.encode("wer is not it"))
    assert stream.delta(finished=False) == "</answer is not it"
    assert stream.delta(finished=True) == ""


@pytest.mark.parametrize("chunk", [1, 3])
def test_characters_split_across_tokens(tokenizer, chunk):
    text = "naïve café ✓ 😀 – done"
    deltas, _ = _stream_out(tokenizer, text, [], chunk)
    assert "".join(deltas) == text
    assert not any("\ufffd" in d for d in deltas)
