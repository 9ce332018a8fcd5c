"""The tokenizer: lossless round trip, end-of-text, chat template shared with transformers."""

import pytest

from specrepro.embedded.checkpoint import tiny_tokenizer_texts
from specrepro.embedded.tokenizer import CHAT_TEMPLATE, Tokenizer, train_bpe

MESSAGES = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": "What is 48/2? Ünïcödé ✓"}]


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    d = tmp_path_factory.mktemp("tok")
    train_bpe(tiny_tokenizer_texts(), vocab_size=400).save(d)
    return Tokenizer.load(d), d


def test_round_trip_and_special_tokens(tok):
    t, _ = tok
    text = "def f(x):\n    return x  # naïve ✓ 日本\n<|endoftext|>Question: 2+2?"
    ids = t.encode(text)
    assert t.decode(ids) == text
    assert t.eos_token_id == 0 and ids.count(t.eos_token_id) == 1
    assert t.decode(ids, skip_special_tokens=True) == text.replace("<|endoftext|>", "")
    assert t.vocab_size == 400


def test_stream_decoder_emits_whole_characters(tok):
    t, _ = tok
    text = "naïve ✓ 日本語 text"
    stream, pieces = t.stream_decoder(), []
    for i in t.encode(text):
        piece = stream.step(t.tok, i)
        if piece is not None:
            assert "\ufffd" not in piece
            pieces.append(piece)
    assert "".join(pieces) == text


def test_chat_template_renders_chatml(tok):
    t, _ = tok
    text = t.apply_chat_template(MESSAGES, tokenize=False)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n"
                    "What is 48/2? Ünïcödé ✓<|im_end|>\n<|im_start|>assistant\n")
    ids = t.apply_chat_template(MESSAGES)
    assert ids[0] == t.im_start_id and t.decode(ids) == text
    no_prompt = t.apply_chat_template(MESSAGES, add_generation_prompt=False, tokenize=False)
    assert not no_prompt.endswith("assistant\n")
    with pytest.raises(ValueError, match="messages\\[0\\]"):
        t.apply_chat_template([{"content": "x"}])
    assert t.stop_token_ids() == [t.eos_token_id, t.im_end_id]


def test_transformers_autotokenizer_agrees(tok):
    transformers = pytest.importorskip("transformers")
    t, d = tok
    hf = transformers.AutoTokenizer.from_pretrained(str(d))
    assert hf.eos_token_id == t.eos_token_id
    assert hf.chat_template == CHAT_TEMPLATE
    text = "x = 1  # ✓\nQuestion:"
    assert hf.encode(text, add_special_tokens=False) == t.encode(text)
    assert (hf.apply_chat_template(MESSAGES, add_generation_prompt=True, tokenize=False)
            == t.apply_chat_template(MESSAGES, tokenize=False))
