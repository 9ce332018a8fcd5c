"""The in-process `transformers` peer: plain and assisted generation on the embedded checkpoint.

Design:
- The one engine the harness drives in-process. It loads the embedded checkpoint (a Hugging
  Face Qwen3 folder) with `AutoModelForCausalLM`, and for speculative arms the small draft
  model saved beside it (`<checkpoint>/<name>/`, the drafter whose method is `draft_model`
  in `drafters.json`, also a Hugging Face folder) as `assistant_model`. The number of draft
  tokens is pinned: `num_assistant_tokens = K`, `num_assistant_tokens_schedule="constant"`,
  and the assistant's confidence threshold off, so every step drafts K tokens like an
  engine's static draft length.
- One request at a time: a cell's concurrency is served sequentially (the runner warns).
- Each request gives the load generator's `RequestRecord`: TTFT and per-token ITL from a
  streamer (`put` is called once with the prompt, then once per target step with the tokens
  that step produced: one for plain decoding, accepted + 1 for assisted), tokens, text,
  finish reason; the same per-request seed (`loadgen.request_seed`) seeds torch.
- transformers exposes no acceptance counters, so the peer derives its own from what the
  streamer sees per step: a step that yields m tokens accepted m − 1 drafts (acceptance is a
  prefix, so positions 0..m−2 were accepted); drafts proposed in a step are
  min(K, max_new_tokens − produced − 1), the candidate generator's own cap. These are
  recorded under `spec["peer"]` and summed by the runner, with a warning that they are
  derived, not read from the library.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from specrepro.harness.loadgen import LoadConfig, request_seed
from specrepro.harness.records import LoadResult, RequestRecord
from specrepro.params import Profile
from specrepro.workloads import Prompt

DERIVED_NOTE = ("transformers peer: acceptance counts derived from the tokens each target "
                "step streamed (transformers exposes no counters)")


class PeerError(RuntimeError):
    """The peer cannot load its checkpoint or draft model; the message names the path."""


def version() -> str:
    import transformers

    return transformers.__version__


def draft_model_dir(drafter_id: str | Path, root: Path) -> Path:
    """The Hugging Face folder of the small draft model named by a profile's drafter.id:
    the folder itself if it holds a causal LM, else the `draft_model` drafter listed in its
    drafters.json (how the embedded checkpoint stores it)."""
    d = Path(drafter_id)
    d = d if d.is_absolute() else root / d
    index = d / "drafters.json"
    if index.is_file():
        names = [n for n, m in json.loads(index.read_text()).items() if m == "draft_model"]
        if not names:
            raise PeerError(f"{index}: no drafter with method 'draft_model' (found "
                            f"{index.read_text().strip()})")
        d = d / names[0]
    if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
        raise PeerError(f"{d}: expected a Hugging Face causal LM (config.json, "
                        "model.safetensors) for the assistant model")
    return d


@dataclass
class StepStreamer:
    """A transformers streamer that timestamps each target step's tokens."""

    record: RequestRecord
    prompt_seen: bool = False
    steps: list[int] = field(default_factory=list)  # tokens per step

    def put(self, value) -> None:
        now = time.monotonic()
        if not self.prompt_seen:  # generate() first puts the prompt
            self.prompt_seen = True
            return
        ids = [int(t) for t in value.reshape(-1).tolist()]
        if not ids:
            return
        self.record.add_chunk(now, len(ids))
        self.steps.append(len(ids))

    def end(self) -> None:
        pass


class TransformersPeer:
    """An in-process engine on a profile of engine `transformers`."""

    def __init__(self, profile: Profile, root: Path | str = "."):
        self.profile = profile
        self.root = Path(root)
        self.model = self.tokenizer = self.assistant = None
        self.k = profile.speculative.num_speculative_tokens if profile.speculative else None
        if profile.speculative is not None and profile.method != "draft_model":
            raise PeerError(f"profile {profile.name!r}: the transformers peer runs assisted "
                            f"generation with a draft model only, found method "
                            f"{profile.method!r}")

    def version(self) -> str:
        return version()

    def load(self) -> TransformersPeer:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        flags = self.profile.flags
        device = str(flags.get("device", "cpu"))
        dtype = getattr(torch, str(flags.get("dtype", "float32")))
        if flags.get("threads") is not None:
            # The same CPU threads as the server it is compared with (serve.py --threads):
            # otherwise the comparison measures thread counts, not engines.
            torch.set_num_threads(int(flags["threads"]))
        target = Path(self.profile.model.id)
        target = target if target.is_absolute() else self.root / target
        if not (target / "config.json").is_file():
            raise PeerError(f"profile {self.profile.name!r}: no checkpoint at {target} "
                            "(model.id; relative paths are from the repository root)")
        self.tokenizer = AutoTokenizer.from_pretrained(target)
        self.model = AutoModelForCausalLM.from_pretrained(target, dtype=dtype).to(device).eval()
        if self.k is not None:
            if self.profile.drafter is None:
                raise PeerError(f"profile {self.profile.name!r}: method draft_model needs a "
                                "drafter (the draft model's folder)")
            path = draft_model_dir(self.profile.drafter.id, self.root)
            self.assistant = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            self.assistant = self.assistant.to(device).eval()
            gc = self.assistant.generation_config  # the candidate generator reads these
            gc.num_assistant_tokens = self.k
            gc.num_assistant_tokens_schedule = "constant"
            gc.assistant_confidence_threshold = 0.0
        self.device = device
        return self

    # -- one request

    def prompt_ids(self, prompt: Prompt, cfg: LoadConfig):
        tok = self.tokenizer
        if prompt.form == "chat":
            kwargs = {}
            if cfg.thinking is not None:
                kwargs["enable_thinking"] = cfg.thinking
            elif cfg.reasoning_effort is not None:
                kwargs["enable_thinking"] = cfg.reasoning_effort != "none"  # vLLM's rule
            enc = tok.apply_chat_template(prompt.messages, add_generation_prompt=True,
                                          return_tensors="pt", return_dict=True, **kwargs)
            return enc["input_ids"]
        return tok(prompt.text, return_tensors="pt")["input_ids"]

    def generate(self, idx: int, prompt: Prompt, cfg: LoadConfig) -> RequestRecord:
        """One request, recorded like the load generator's; failures are recorded."""
        import torch

        seed = request_seed(cfg.seed, idx)
        record = RequestRecord(idx, prompt.id, seed)
        try:
            ids = self.prompt_ids(prompt, cfg).to(self.device)
            streamer = StepStreamer(record)
            kwargs = self.generate_kwargs(prompt, cfg)
            torch.manual_seed(seed)
            record.started = time.monotonic()
            with torch.inference_mode():
                out = self.model.generate(ids, attention_mask=torch.ones_like(ids),
                                          streamer=streamer, **kwargs)
            record.e2e_s = time.monotonic() - record.started
            self.finish(record, ids.shape[-1], out[0, ids.shape[-1]:].tolist(), prompt,
                        streamer.steps)
        except Exception as err:  # noqa: BLE001 - a failed request is recorded, not raised
            record.error = f"{type(err).__name__}: {err}"
            record.e2e_s = time.monotonic() - record.started if record.started else None
        return record

    def generate_kwargs(self, prompt: Prompt, cfg: LoadConfig) -> dict:
        kw: dict = {"max_new_tokens": prompt.max_tokens, "do_sample": cfg.temperature > 0}
        if cfg.temperature > 0:
            kw.update(temperature=cfg.temperature, top_p=cfg.top_p,
                      top_k=max(0, cfg.top_k))
        if cfg.ignore_eos:
            kw["min_new_tokens"] = prompt.max_tokens  # EOS suppressed until the cap
        if prompt.stop:
            # A stopping criterion, not `stop_strings`: assisted generation copies the
            # generation config into the assistant's own generate call without the
            # tokenizer, which `stop_strings` needs (transformers raises there).
            from transformers import StoppingCriteriaList, StopStringCriteria

            kw["stopping_criteria"] = StoppingCriteriaList(
                [StopStringCriteria(self.tokenizer, list(prompt.stop))])
        if self.assistant is not None:
            kw.update(assistant_model=self.assistant, num_assistant_tokens=self.k,
                      num_assistant_tokens_schedule="constant")
        return kw

    def finish(self, r: RequestRecord, n_prompt: int, new_ids: list[int], prompt: Prompt,
               steps: list[int]) -> None:
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
        r.prompt_tokens, r.completion_tokens, r.token_ids = n_prompt, len(new_ids), new_ids
        text = self.tokenizer.decode(new_ids, skip_special_tokens=True)
        cut = min((i for s in prompt.stop if (i := text.find(s)) != -1), default=None)
        r.text = text if cut is None else text[:cut]
        stopped = cut is not None or (new_ids and new_ids[-1] in eos)
        r.finish_reason = "stop" if stopped or len(new_ids) < prompt.max_tokens else "length"
        if self.k is not None:
            r.spec = {"peer": self.step_counts(steps, prompt.max_tokens)}

    def step_counts(self, steps: list[int], max_new: int) -> dict:
        """Drafts, draft tokens, accepted tokens and accepted-per-position from step sizes."""
        per_pos = [0] * self.k
        produced = drafted = 0
        for m in steps:
            drafted += max(0, min(self.k, max_new - produced - 1))
            for i in range(min(m - 1, self.k)):
                per_pos[i] += 1
            produced += m
        accepted = sum(per_pos)
        return {"num_drafts": len(steps), "num_draft_tokens": drafted,
                "num_accepted_tokens": accepted, "accepted_per_pos": per_pos}

    # -- one cell

    def run(self, prompts: Sequence[Prompt], cfg: LoadConfig,
            records: list[RequestRecord] | None = None) -> LoadResult:
        """Every prompt once, one at a time (warm-up first, discarded). `records` fills as
        requests end, so an interrupted run keeps them."""
        if cfg.steady is not None:
            raise PeerError("the transformers peer sends every prompt once, never a steady "
                            "window: it has no counters to read a window from")
        records = [] if records is None else records
        from specrepro.harness.loadgen import warmup_prompts

        for i, p in enumerate(warmup_prompts(prompts, cfg.warmup)):
            self.generate(i, p, cfg)
        start = time.monotonic()
        for idx, prompt in enumerate(prompts):
            records.append(self.generate(idx, prompt, cfg))
        end = time.monotonic()
        return LoadResult(records, end - start, span=(start, end))


def peer_counts(records: Sequence[RequestRecord]) -> dict | None:
    """The peer's derived counters summed over a cell's requests (None without any)."""
    rows = [r.spec["peer"] for r in records if r.spec and "peer" in r.spec]
    if not rows:
        return None
    k = max(len(r["accepted_per_pos"]) for r in rows)
    return {"num_drafts": sum(r["num_drafts"] for r in rows),
            "num_draft_tokens": sum(r["num_draft_tokens"] for r in rows),
            "num_accepted_tokens": sum(r["num_accepted_tokens"] for r in rows),
            "accepted_per_pos": [sum(r["accepted_per_pos"][i] for r in rows
                                     if i < len(r["accepted_per_pos"])) for i in range(k)]}
