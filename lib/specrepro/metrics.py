"""Every metric of the suite, defined once (docs/design.md, "Metrics, defined once").

The harness computes cell figures with these functions and the analysis
recomputes derived figures with the same ones, so a definition never drifts
between the two. Inputs are plain numbers and sequences; nothing here knows an
engine, a table library or a file. Missing inputs give ``None`` rather than a
made-up zero, so a table shows a gap where nothing was measured.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den == 0:
        return None
    return num / den


def acceptance_length(accepted_tokens: float | None, drafts: float | None) -> float | None:
    """Tokens per target step, bonus token included: 1 + Δaccepted / Δdrafts.

    This is `vllm bench serve`'s figure (vllm/v1/spec_decode/metrics.py). For
    SGLang pass spec_num_correct_drafts and spec_verify_ct, which puts it on the
    same footing (SGLang's own spec_accept_length also counts the prefill token).
    """
    r = _ratio(accepted_tokens, drafts)
    return None if r is None else 1.0 + r


def draft_acceptance_rate(accepted_tokens: float | None, draft_tokens: float | None) -> float | None:
    """Share of proposed draft tokens that the target kept: Δaccepted / Δdraft_tokens."""
    return _ratio(accepted_tokens, draft_tokens)


def per_position_acceptance(accepted_per_pos: Sequence[float] | None,
                            drafts: float | None) -> list[float] | None:
    """Acceptance at draft position i: Δaccepted_per_pos[i] / Δdrafts.

    Summed over positions it equals acceptance_length - 1, a check worth making:
    article A's published per-position rates sum to 3.40 where its text says 3.16.
    """
    if accepted_per_pos is None or not drafts:
        return None
    return [a / drafts for a in accepted_per_pos]


def agg_tok_s(output_tokens: float | None, wall_s: float | None) -> float | None:
    """Aggregate decode throughput: output tokens / wall time of the window."""
    return _ratio(output_tokens, wall_s)


def per_stream_tok_s(aggregate_tok_s: float | None, concurrency: int | None) -> float | None:
    return _ratio(aggregate_tok_s, concurrency)


def step_ms(accept_len: float | None, stream_tok_s: float | None) -> float | None:
    """Milliseconds per target step: 1000 × acceptance length / per-stream tok/s.

    Article A: 3.16 tokens per step at 26.0 tok/s is a 122 ms step.
    """
    r = _ratio(accept_len, stream_tok_s)
    return None if r is None else 1000.0 * r


def tokens_per_joule(output_tokens: float | None, energy_j: float | None) -> float | None:
    """Output tokens / ∫ board power dt."""
    return _ratio(output_tokens, energy_j)


def roofline_tok_s(accept_len: float, bandwidth_bytes_s: float, bytes_per_step: float) -> float:
    """Bandwidth ceiling of one stream: acceptance length × bandwidth / bytes read per step."""
    return accept_len * bandwidth_bytes_s / bytes_per_step


def repeated_ngram_share(tokens: Sequence, n: int = 4) -> float | None:
    """Share of n-grams in a sequence that occurred earlier in the same sequence.

    Repetition is easy to draft and inflates acceptance (docs/embedded-model.md,
    "Recipe lessons", item 4; article B's ignore_eos warning), so every acceptance figure has
    this beside it. `tokens` may be token ids or words; None when the sequence
    has no n-gram.
    """
    grams = [tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)]
    if not grams:
        return None
    seen: set[tuple] = set()
    repeated = 0
    for g in grams:
        repeated += g in seen
        seen.add(g)
    return repeated / len(grams)


def pooled_repeated_ngram_share(sequences: Sequence[Sequence], n: int = 4) -> float | None:
    """Repeated-n-gram share over many outputs, weighting each by its n-gram count."""
    total = repeated = 0
    for seq in sequences:
        share = repeated_ngram_share(seq, n)
        if share is None:
            continue
        count = len(seq) - n + 1
        total += count
        repeated += share * count
    return None if total == 0 else repeated / total


# A cell whose pooled repeated-4-gram share is at least this is "mostly loops": its acceptance
# measures how easy repetition is to draft, not the drafter. Chosen from
# the data (scripts/text_quality.py natural / cells prints every figure, with the embedded
# model's tokenizer): natural text pooled repeats 0.057 of its 4-grams over 512-token
# windows of WikiText-2 test (valid 0.051; no window above 0.33), GSM8K's gold answers 0.062,
# HumanEval's reference solutions 0.143, standard-library code 0.196 (single 512-token code
# windows reach 0.55 at the 99th percentile; a cell pools many outputs). The 994 stored ok
# cells of results/*/ (2026-12-04) split into 580 at 0.398 or less (GSM8K up to 0.398,
# sampled code, 48-64-token essays) and 414 at 0.458 or more, nothing between; every one of
# those 414 ended at least 87.5 % of its requests at max_tokens (mean 97 %), with outputs
# such as "the presses of the presses of ...". 0.45 sits in that empty band, more than
# twice the most repetitive natural text.
LOOP_SHARE = 0.45


def mostly_loops(repeated_share: float | None) -> bool | None:
    """Whether a cell's outputs are mostly loops (`LOOP_SHARE`); None where not measured."""
    if repeated_share is None or math.isnan(repeated_share):
        return None
    return repeated_share >= LOOP_SHARE


def length_share(finish_reasons: Sequence[str | None]) -> float | None:
    """Share of requests that ended at max_tokens (finish_reason "length"): their text was cut
    by the cap, not ended by the model. Requests without a finish reason are left out; None
    where none has one. A cell near 1 measured text the model never finished, which is where
    greedy text loops (article B banned ignore_eos for this)."""
    known = [r for r in finish_reasons if r is not None]
    if not known:
        return None
    return sum(r == "length" for r in known) / len(known)


def words(text: str) -> list[str]:
    """Whitespace words: the unit for repetition when an engine returns no token ids."""
    return text.split()


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolated percentile (q in [0, 100]) as numpy's default; None when empty."""
    xs = sorted(v for v in values if v is not None)
    if not xs:
        return None
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def request_itl_s(gaps_s: Sequence[float], output_tokens: int | None) -> float | None:
    """One request's inter-token latency as the peers define it: (last token's arrival −
    first token's) / (output tokens − 1), seconds; None for one token or fewer.

    guidellm 0.8.1 (`GenerativeRequestStats.inter_token_latency_ms`,
    guidellm/schemas/base/request_stats.py:337-354, first and last token: the arrivals of
    the first and last content chunks, guidellm/backends/openai/http.py:378-393) and
    `vllm bench serve` 0.26.0 (TPOT = (latency − ttft) / (output_len − 1),
    vllm/benchmarks/serve.py:607-611, latency being the arrival of the last chunk with
    choices, vllm/benchmarks/lib/endpoint_request_func.py:231-257) both divide the time from
    the first token to the last by the tokens after the first. `gaps_s` are the request's per-token gaps (the load generator's `itl_s`): they
    add up to exactly last − first, however many tokens a chunk carried.
    """
    if output_tokens is None or output_tokens <= 1:
        return None
    return sum(gaps_s) / (output_tokens - 1)


def token_gaps_s(chunk_gap_us: Sequence[int], chunk_tokens: Sequence[int]) -> list[float]:
    """A request's per-token gaps (the load generator's `itl_s`, seconds) from the chunks
    its stream delivered, as the requests table stores them: `chunk_gap_us[0]` the first
    token-carrying chunk's arrival in microseconds after the request was sent (its TTFT),
    `chunk_gap_us[i]` the i-th chunk's arrival after the one before, `chunk_tokens[i]` its
    tokens. The first chunk's m tokens give m − 1 gaps of 0; a later chunk of m tokens
    after a gap g gives m gaps of g / m (a speculative step's tokens arrive together and
    share its gap)."""
    gaps: list[float] = []
    for i, (g, m) in enumerate(zip(chunk_gap_us, chunk_tokens, strict=True)):
        gaps += [0.0] * (m - 1) if i == 0 else [g / 1e6 / m] * m
    return gaps


def chunks_from_gaps(ttft_s: float | None,
                     gaps_s: Sequence[float]) -> tuple[list[int], list[int]]:
    """The inverse of `token_gaps_s`, for requests stored before the table kept chunks
    (per-token gaps in float seconds): the leading zeros are the first chunk's other
    tokens; each later run of equal gaps is one chunk of that many tokens. Arrivals are
    rounded to the microsecond before they are differenced, so the gaps add up to the
    stored total. Two consecutive chunks whose gaps per token were equal to the last bit
    read as one (not seen in the committed stores: compact checks every request)."""
    if ttft_s is None:
        return [], []
    at, i, n = ttft_s, 0, len(gaps_s)
    while i < n and gaps_s[i] == 0.0:
        i += 1
    arrivals, tokens = [at], [i + 1]
    while i < n:
        j = i
        while j < n and gaps_s[j] == gaps_s[i]:
            j += 1
        at += gaps_s[i] * (j - i)
        arrivals.append(at)
        tokens.append(j - i)
        i = j
    return arrival_gaps_us(arrivals), tokens


def arrival_gaps_us(arrivals_s: Sequence[float]) -> list[int]:
    """Chunk arrivals (seconds after the request was sent) as the requests table stores
    them: the first in µs, each later one as its µs after the one before. Arrivals are
    rounded before they are differenced, so the gaps add up to the last arrival."""
    at = [round(t * 1e6) for t in arrivals_s]
    return at[:1] + [b - a for a, b in itertools.pairwise(at)]


def request_mean_itl_s(requests: Sequence[tuple[Sequence[float], int | None]]) -> float | None:
    """Mean over requests of `request_itl_s` (each request counts once): `vllm bench serve`'s
    mean TPOT (np.mean over requests, vllm/benchmarks/serve.py:742). guidellm's ITL mean
    weights each request by output_tokens − 1 (guidellm/benchmark/schemas/metrics.py:
    1466-1470); the two agree where every output has one length (ignore_eos, max_tokens).

    Beside it the suite keeps the token-weighted median of per-token gaps (`itl_p50_ms`):
    under speculative decoding a step's tokens arrive in one chunk and share its gap, so
    that median sits well below this mean (the embedded server's block drafter:
    4.3-5.3 ms against 6.5-7.9 ms on the same requests).
    """
    values = [v for v in (request_itl_s(g, n) for g, n in requests) if v is not None]
    return sum(values) / len(values) if values else None


def relative_change_pct(new: float | None, old: float | None) -> float | None:
    """(new / old − 1) × 100, the unit of article B's gates (+6.0 %, −2 %)."""
    r = _ratio(new, old)
    return None if r is None else (r - 1.0) * 100.0

