"""The embedded model's tokenizer: byte-level BPE, an end-of-text token, a chat template.

Design:
- Byte-level BPE trained with `tokenizers` (GPT-2's byte alphabet as the initial
  alphabet, so every string encodes and decodes losslessly). Special tokens come
  first: `<|endoftext|>` = 0 (separates training documents, so the model learns to
  end one; it is the end-of-text/eos token), `<|im_start|>` = 1, `<|im_end|>` = 2.
- The chat template is ChatML (`<|im_start|>role\\ncontent<|im_end|>\\n`) written as
  Jinja in `tokenizer_config.json`, where `transformers.AutoTokenizer` reads it,
  and rendered here with jinja2, so the engine and `transformers` build the same
  prompt ids.
- Streaming: `stream_decoder()` returns a `tokenizers` `DecodeStream`, which holds
  back bytes until they form whole UTF-8 characters (a byte-level token can split
  a character), so a server emits text token by token without stray U+FFFD.
- Imports only tokenizers and jinja2 (the H200 image has both).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterable, Sequence
from pathlib import Path

import jinja2
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, pre_tokenizers, trainers

EOS_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (EOS_TOKEN, IM_START, IM_END)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_bpe(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> Tokenizer:
    """Train a byte-level BPE on `texts` (an iterable of documents)."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
        special_tokens=list(SPECIAL_TOKENS), initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(texts, trainer=trainer)
    return Tokenizer(tok)


class Tokenizer:
    """The engine's tokenizer: ids in, text out, and the chat template."""

    def __init__(self, tok: HFTokenizer, chat_template: str = CHAT_TEMPLATE,
                 model_max_length: int = 4096):
        self.tok = tok
        self.chat_template = chat_template
        self.model_max_length = model_max_length
        ids = [tok.token_to_id(t) for t in SPECIAL_TOKENS]
        if any(i is None for i in ids):
            raise ValueError(f"tokenizer lacks a special token among {SPECIAL_TOKENS}")
        self.eos_token_id, self.im_start_id, self.im_end_id = ids
        self.eos_token = EOS_TOKEN
        env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True,
                                 undefined=jinja2.StrictUndefined)
        self._template = env.from_string(chat_template)

    # -- ids <-> text -------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tok.get_vocab_size()

    @functools.cached_property
    def max_token_chars(self) -> int:
        """The most characters of a text one token can stand for: the longest vocabulary
        string. A byte-level token of n bytes covers at most n characters (each character is
        1-4 bytes, each written as one alphabet character in the vocabulary), and a special
        token its own literal text; so a text of C characters is at least
        C / max_token_chars tokens (the server refuses a prompt too long for the context
        from this, without tokenizing it)."""
        return max(len(s) for s in self.tok.get_vocab(with_added_tokens=True))

    def encode(self, text: str) -> list[int]:
        return self.tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [e.ids for e in self.tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def stream_decoder(self, skip_special_tokens: bool = False) -> decoders.DecodeStream:
        """Incremental detokenizer: `d.step(self.tok, token_id) -> str | None` (None until
        the bytes so far form whole characters)."""
        return decoders.DecodeStream(skip_special_tokens=skip_special_tokens)

    def stop_token_ids(self) -> list[int]:
        """Tokens that end a generation: end of text, and end of a chat turn."""
        return [self.eos_token_id, self.im_end_id]

    # -- chat ---------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[dict], add_generation_prompt: bool = True,
                            tokenize: bool = True, **template_kwargs) -> list[int] | str:
        """Render `messages` ([{"role", "content"}]) as `transformers` does: ids by
        default, the prompt string with `tokenize=False`. Extra keyword arguments
        (a request's `chat_template_kwargs`, e.g. `enable_thinking`) reach the
        template as variables, as in transformers."""
        for i, m in enumerate(messages):
            if not isinstance(m, dict) or "role" not in m or "content" not in m:
                raise ValueError(f"messages[{i}] needs 'role' and 'content', got {m!r}")
        text = self._template.render(**template_kwargs, messages=list(messages),
                                     add_generation_prompt=add_generation_prompt)
        return self.encode(text) if tokenize else text

    # -- files --------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        """Write tokenizer.json and tokenizer_config.json (AutoTokenizer's layout)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.tok.save(str(d / "tokenizer.json"))
        added = {str(self.tok.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True} for t in SPECIAL_TOKENS}
        cfg = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": None,
            "eos_token": EOS_TOKEN,
            "pad_token": EOS_TOKEN,
            "unk_token": None,
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "model_max_length": self.model_max_length,
            "added_tokens_decoder": added,
            "chat_template": self.chat_template,
        }
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2) + "\n")
        (d / "special_tokens_map.json").write_text(json.dumps(
            {"eos_token": EOS_TOKEN, "pad_token": EOS_TOKEN}, indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Tokenizer:
        d = Path(directory)
        path = d / "tokenizer.json"
        if not path.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {d}")
        cfg_path = d / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text()) if cfg_path.is_file() else {}
        return cls(HFTokenizer.from_file(str(path)),
                   chat_template=cfg.get("chat_template", CHAT_TEMPLATE),
                   model_max_length=cfg.get("model_max_length", 4096))
