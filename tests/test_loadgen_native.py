"""SGLang's native `POST /generate` path (profile `api: native`): the load generator against a
fake SGLang 0.5.14 that streams as its source does, the cell's acceptance from the final
meta_info, and the params checks.

How SGLang 0.5.14 streams `/generate` (read in its wheel, sglang-0.5.14-cp312; the load
generator's docstring cites the lines): one SSE event `data: <json>\\n\\n` per output and a
closing `data: [DONE]\\n\\n` (srt/entrypoints/http_server.py:778, :797); a ValueError
mid-stream is one `data: {"error": {...}}` event before [DONE] (:787-796). Every event is
`{"text", "output_ids", "meta_info"}`; `text` and `output_ids` are the whole output so far
unless the server runs with `--incremental-streaming-output` (then the increment;
srt/managers/tokenizer_manager.py:1945-1989, srt/server_args.py:965-968); meta_info's
`completion_tokens` is the count so far, `finish_reason` null until the last event, and the
speculative fields are in the last event only (tokenizer_manager.py:2052-2062, :2301-2352).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp import web

from conftest import ThreadedApp
from specrepro import params
from specrepro.harness import engines
from specrepro.harness.cells import acceptance, latency_fields
from specrepro.harness.engines.sglang import SGLANG_FROM_NATIVE
from specrepro.harness.loadgen import (
    LoadConfig,
    LoadGenerator,
    NativeStreamTimer,
    request_body,
    run_load,
)
from specrepro.harness.records import RequestRecord
from specrepro.params import ParamsError
from specrepro.workloads import Prompt

FIXTURE = (Path(__file__).resolve().parent / "fixtures" / "engines" / "sglang-0.5.14"
           / "dflash_light.generate-meta_info.json")
META = json.loads(FIXTURE.read_text())  # three 64-token answers, DFLASH k = 7
GAP_S = 0.02  # the fake server's time between two events

SGLANG = engines.engine("sglang")
SGLANG_FEATURES = SGLANG.request_features


def prompts() -> list[Prompt]:
    return [Prompt(id=f"p{i}", workload="gsm8k", max_tokens=64, text=f"prompt {i}:",
                   stop=("Question:",)) for i in range(len(META))]


def steps(meta: dict) -> list[int]:
    """Tokens per event of one answer: the prefill's token, then a verify step per event,
    each keeping 1 + j tokens for the histogram's j (fewest first), cut at completion_tokens
    as SGLang cuts at max_new_tokens (its correct drafts are counted before the cut)."""
    sizes, left = [1], meta["completion_tokens"] - 1
    for j, n in enumerate(meta["spec_accept_histogram"]):
        for _ in range(n):
            if left > 0:
                sizes.append(min(1 + j, left))
                left -= sizes[-1]
    assert left == 0
    return sizes


def token(i: int, pos: int) -> tuple[int, str]:
    return 1000 * (i + 1) + pos, f"w{pos} "


class FakeSGLang(ThreadedApp):
    """SGLang 0.5.14's /generate on a thread: streams each fixture answer in `steps`."""

    def __init__(self, incremental: bool = False):
        self.incremental = incremental
        self.bodies: list[dict] = []
        super().__init__()

    async def make_app(self) -> web.Application:
        app = web.Application()
        app.router.add_post("/generate", self.generate)
        return app

    async def generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        text = body["text"]
        if text == "bad-http":  # rejected before streaming (tokenizer_manager's ValueError)
            return web.json_response({"error": {"message": "The input is too long",
                                                 "code": 400}}, status=400)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)

        async def send(obj) -> None:
            raw = obj if isinstance(obj, str) else json.dumps(obj)
            await resp.write(f"data: {raw}\n\n".encode())

        if text == "error-chunk":  # http_server.py:787-797
            await send({"error": {"message": "sampling failed", "type": "invalid_request_error",
                                  "code": 400, "retryable": False}})
        elif text == "aborted":  # FINISH_ABORT, schedule_batch.py:202-215
            await send({"text": "", "output_ids": [], "meta_info": {
                "id": "x", "prompt_tokens": 3, "completion_tokens": 0, "finish_reason": {
                    "type": "abort", "message": "server overloaded", "status_code": 503,
                    "err_type": None}}})
        else:
            i = int(text.split()[1].rstrip(":"))
            meta, ids, words = META[i], [], []
            for n, m in enumerate(steps(meta)):
                await asyncio.sleep(GAP_S)
                new = [token(i, len(ids) + k) for k in range(m)]
                ids += [t for t, _ in new]
                words += [w for _, w in new]
                last = len(ids) == meta["completion_tokens"]
                info = dict(meta) if last else {
                    "id": meta["id"], "finish_reason": None,
                    "prompt_tokens": meta["prompt_tokens"], "weight_version": "default",
                    "num_retractions": 0, "reasoning_tokens": 0,
                    "completion_tokens": len(ids), "cached_tokens": 0}
                if self.incremental:
                    out = {"text": "".join(w for _, w in new), "output_ids": [t for t, _ in new]}
                else:
                    out = {"text": "".join(words), "output_ids": list(ids)}
                await send({**out, "meta_info": info})
        await send("[DONE]")
        await resp.write_eof()
        return resp


@pytest.fixture(params=[False, True], ids=["cumulative", "incremental"])
def sglang(request):
    srv = FakeSGLang(incremental=request.param)
    yield srv
    srv.close()


def native_cfg(url: str, **kw) -> LoadConfig:
    return LoadConfig(url=url, model="embedded", features=SGLANG_FEATURES, api="native", seed=5,
                      extra_body={"return_spec_tokens_details": True}, **kw)


# ------------------------------------------------------------------ the stream


def test_native_requests_against_sglang_as_its_source_streams(sglang):
    ps = prompts()
    result = run_load(ps, native_cfg(sglang.url, concurrency=2))
    records = sorted(result.records, key=lambda r: r.request_idx)
    assert [r.error for r in records] == [None] * 3
    for i, r in enumerate(records):
        meta, sizes = META[i], steps(META[i])
        assert r.token_ids == [token(i, p)[0] for p in range(64)]
        assert r.text == "".join(token(i, p)[1] for p in range(64))
        assert r.finish_reason == "length"  # {"type": "length", "length": 64}
        assert r.completion_tokens == 64 and r.prompt_tokens == meta["prompt_tokens"]
        # per token, as on the OpenAI path: one arrival time per event for all its tokens,
        # its gap split into as many ITLs
        assert len(r.itl_s) == 63 and len(r.arrivals) == 64
        groups = [r.arrivals.count(t) for t in dict.fromkeys(r.arrivals)]
        assert groups == sizes
        at, k = 0, 0
        for n, m in enumerate(sizes):
            if n:
                gap = r.arrivals[at] - r.arrivals[at - 1]
                assert r.itl_s[k:k + m] == pytest.approx([gap / m] * m)
                assert gap > GAP_S / 2
            k, at = k + (m if n else m - 1), at + m
        assert r.ttft_s == pytest.approx(r.arrivals[0] - r.started)
        assert r.ttft_s >= GAP_S and r.e2e_s >= r.arrivals[-1] - r.started
        assert r.spec["sglang_meta"]["spec_verify_ct"] == meta["spec_verify_ct"]
        assert r.spec["sglang_meta"]["spec_accept_histogram"] == meta["spec_accept_histogram"]
    assert latency_fields(records)["itl_p50_ms"] is not None
    # what was sent: SGLang's /generate body, sampling_params in its names
    body = sglang.bodies[0]
    assert set(body) == {"text", "sampling_params", "stream"} and body["stream"] is True
    sp = body["sampling_params"]
    assert set(sp) == {"temperature", "top_p", "top_k", "max_new_tokens", "sampling_seed",
                       "stop"}
    assert sp["max_new_tokens"] == 64 and sp["stop"] == ["Question:"] and sp["temperature"] == 0
    assert sorted(b["sampling_params"]["sampling_seed"] for b in sglang.bodies) == sorted(
        r.seed for r in records)


def test_native_cell_acceptance_from_the_final_meta_info(sglang):
    """Cell figures computed by hand from the fixture's three histograms (k = 7):
    A [7,2,2,0,2,3,2,1] (19 steps, 48 correct), B [18,14,3,2] (37, 26), C [9,5,2,2,2,2,0,1]
    (23, 40). Position i was kept in the steps that kept more than i drafts:
    pos 0: 12 + 19 + 14 = 45, pos 1: 10 + 5 + 9 = 24, pos 2: 8 + 2 + 7 = 17,
    pos 3: 8 + 0 + 5 = 13, pos 4: 6 + 0 + 3 = 9, pos 5: 3 + 0 + 1 = 4, pos 6: 1 + 0 + 1 = 2
    (sum 114 = the correct drafts), over 79 verify steps."""
    records = run_load(prompts(), native_cfg(sglang.url)).records
    warnings: list[str] = []
    acc = acceptance(None, records, SGLANG, warnings, k=7)
    assert acc["num_drafts"] == 79 and acc["num_accepted_tokens"] == 114
    assert acc["num_draft_tokens"] == 133 + 259 + 161 == 553
    assert acc["acceptance_length"] == pytest.approx(1 + 114 / 79)
    assert acc["draft_acceptance_rate"] == pytest.approx(114 / 553)
    assert acc["per_position_acceptance"] == pytest.approx(
        [45 / 79, 24 / 79, 17 / 79, 13 / 79, 9 / 79, 4 / 79, 2 / 79])
    # the source is said, with SGLang's own tokens per step: Σcompletion / Σverify
    note = SGLANG_FROM_NATIVE.format(n=3, own=f"{192 / 79:.4g}")
    assert note in warnings and "2.43" in note


def test_native_errors_are_recorded_not_raised(sglang):
    bad = [Prompt(id=f"e{i}", workload="gsm8k", max_tokens=8, text=t)
           for i, t in enumerate(("bad-http", "error-chunk", "aborted"))]
    records = sorted(run_load([*bad, prompts()[0]], native_cfg(sglang.url, concurrency=4)
                              ).records, key=lambda r: r.request_idx)
    http, chunk, abort, good = records
    assert http.error.startswith("HTTP 400 from /generate") and "too long" in http.error
    assert chunk.error == "sampling failed"
    assert abort.error == ("SGLang finished the request with 'abort' (status 503): "
                           "server overloaded")
    assert good.ok and good.completion_tokens == 64
    # the failed ones do not enter the cell's acceptance
    assert acceptance(None, records, SGLANG, [], k=7)["num_drafts"] == 19


# ------------------------------------------------------------------ the timer alone


@pytest.mark.parametrize("incremental", [False, True])
def test_native_chunks_split_their_gap_like_the_openai_path(incremental):
    """The same times as test_loadgen's OpenAI case: TTFT 0.5 s, a 3-token event after
    0.3 s gives three ITLs of 0.1 s."""
    r = RequestRecord(0, "p", 1, started=10.0)
    timer, ids = NativeStreamTimer(r), []
    for at, new, fin in ((10.5, [7], None), (10.8, [8, 9, 10], None),
                         (11.0, [11], {"type": "stop", "matched": 2})):
        ids += new
        shown = new if incremental else list(ids)
        meta = {"prompt_tokens": 5, "completion_tokens": len(ids), "finish_reason": fin}
        if fin:
            meta |= {"spec_verify_ct": 2, "spec_accepted_drafts": 2, "spec_proposed_drafts": 14}
        timer.chunk({"text": "".join(f"<{t}>" for t in shown), "output_ids": shown,
                     "meta_info": meta}, at)
    timer.finish(11.1)
    assert r.ttft_s == pytest.approx(0.5)
    assert r.itl_s == pytest.approx([0.1, 0.1, 0.1, 0.2])
    assert r.token_ids == [7, 8, 9, 10, 11] and r.text == "<7><8><9><10><11>"
    assert r.finish_reason == "stop" and r.completion_tokens == 5 and r.prompt_tokens == 5
    assert r.e2e_s == pytest.approx(1.1) and r.ok
    # 0.5.14's backward-compat names alone are read as 0.5.23's
    acc = acceptance(None, [r], SGLANG, [])
    assert (acc["num_drafts"], acc["num_accepted_tokens"], acc["num_draft_tokens"]) == (2, 2, 14)


def test_a_request_without_a_verify_step_adds_nothing():
    """SGLang writes no spec_* field for a request with no verify step (its one token came
    from the prefill): with others speculating, it counts as 0 steps, said in a warning;
    with none speculating (no speculation), no acceptance."""
    def rec(i, meta):
        r = RequestRecord(i, f"p{i}", 0)
        r.finish_reason, r.spec = "length", {"sglang_meta": meta}
        return r

    one = {"completion_tokens": 1, "prompt_tokens": 4}
    warnings: list[str] = []
    acc = acceptance(None, [rec(0, META[0]), rec(1, one)], SGLANG, warnings, k=7)
    assert acc["num_drafts"] == 19 and acc["acceptance_length"] == pytest.approx(1 + 48 / 19)
    assert any("1 of 2 SGLang /generate responses had no verify step" in w for w in warnings)
    plain = acceptance(None, [rec(0, one), rec(1, one)], SGLANG, [], k=None)
    assert plain["num_drafts"] is None and plain["per_position_acceptance"] is None


def test_the_native_body_and_its_limits():
    text, chat = prompts()[0], Prompt(id="c0", workload="essays", max_tokens=8,
                                      messages=[{"role": "user", "content": "hi"}])
    path, body = request_body(text, native_cfg("http://x", ignore_eos=True, temperature=0.7,
                                               top_p=0.9, top_k=20), 11)
    assert path == "/generate" and body == {"text": "prompt 0:", "stream": True, "sampling_params": {
        "temperature": 0.7, "top_p": 0.9, "top_k": 20, "max_new_tokens": 64,
        "sampling_seed": 11, "ignore_eos": True, "stop": ["Question:"]}}
    # the OpenAI path is unchanged by default
    assert request_body(text, LoadConfig(url="http://x", model="m", features=SGLANG_FEATURES), 1)[0] \
        == "/v1/completions"
    with pytest.raises(ValueError, match="workload 'essays' is chat-form"):
        run_load([chat], native_cfg("http://127.0.0.1:9"))
    with pytest.raises(ValueError, match="expected an engine that has it"):
        LoadGenerator(LoadConfig(url="http://x", model="m",
                                 features=engines.engine("vllm").request_features, api="native"))


# ------------------------------------------------------------------ params


PROFILE = """\
engine: sglang
command: [python3, -m, sglang.launch_server]
model: {id: models/embedded}
return_spec_details: true
speculative: {method: dflash, num_speculative_tokens: 7}
api: native
"""
STUDY = """\
name: 01_drafter_block_sweep
notebook: 01_drafter_block_sweep
arms:
  - {name: a, profile: sglang-native}
workloads:
  - {name: gsm8k, n: 4, max_tokens: 32, form: FORM}
concurrency: [1]
"""
SUITE = """\
name: t
run_id: r
binds: listed
notebooks:
  01_drafter_block_sweep: {study: studies/01.yaml}
"""


def write_tree(root: Path, form: str, profile: str = PROFILE) -> params.Suite:
    for name, text in (("profiles/sglang-native.yaml", profile),
                       ("studies/01.yaml", STUDY.replace("FORM", form)),
                       ("suite.yaml", SUITE)):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return params.load_suite(root / "suite.yaml")


def test_api_native_needs_sglang_and_completion_prompts(tmp_path: Path):
    study = params.resolve_study(write_tree(tmp_path, "completion"), "01_drafter_block_sweep")
    assert study.arms[0].resolved.api == "native"
    with pytest.raises(ParamsError) as info:
        params.resolve_study(write_tree(tmp_path, "chat"), "01_drafter_block_sweep")
    msg = str(info.value)
    assert "profiles/sglang-native.yaml: api: expected 'openai' for arm 'a'" in msg
    assert "workload 'gsm8k' is chat-form" in msg and "profile 'sglang-native'" in msg
    vllm = PROFILE.replace("engine: sglang", "engine: vllm").replace(
        "return_spec_details: true\n", "")
    with pytest.raises(ParamsError, match="api: expected 'openai' for vllm"):
        params.load_profile(write_tree(tmp_path, "completion", vllm).profiles_path
                            / "sglang-native.yaml")


def test_the_default_api_leaves_a_profiles_identity_alone(tmp_path: Path):
    """Cells measured before the key existed keep their ids."""
    write_tree(tmp_path, "completion")
    path = tmp_path / "profiles/sglang-native.yaml"
    assert params.load_profile(path).model_dump(mode="json")["api"] == "native"
    path.write_text(PROFILE.replace("api: native\n", ""))
    profile = params.load_profile(path)
    assert profile.api == "openai" and "api" not in profile.model_dump(mode="json")
