"""Behaviour of the ``engine serve`` options that act below the HTTP layer (scheduling, sampling
defaults, truncation, CUDA graph sizes, device choice, watchdog, tokenizer and chat template,
remote-code refusal), each against its own unit."""

from __future__ import annotations

import json
import random
import threading
import time
from types import SimpleNamespace

import pytest
import torch

from engine.config import ServerConfig
from engine.errors import ConfigError
from engine.runtime import model_runner
from engine.runtime.cuda_graph import graph_buckets
from engine.runtime.frontend import Runtime, sampling_defaults
from engine.runtime.request import ReqOutput
from engine.runtime.sampling import SamplingParams
from engine.runtime.schedule_policy import POLICIES, order, retraction_victim
from engine.runtime.step_timer import StepTimer
from engine.runtime.watchdog import Watchdog
from engine.server.generation import merge_outputs, usage, SeqState
from engine.server.protocol import to_sampling_params
from test_sched_scheduler import make_req, make_sched, run


def req(prompt_len: int, *, arrival: float = 0.0, max_new: int = 8, priority: int = 0,
        key: str | None = None):
    r = make_req(list(range(1, prompt_len + 1)), {}, max_new=max_new)
    r.arrival, r.priority, r.routing_key = arrival, priority, key
    return r


def ranked(policy: str, reqs, cached=None, running=(), **kw) -> list[int]:
    cached = cached or {}
    nodes = kw.pop("nodes", {})
    out = order(policy, reqs, match=lambda r: (cached.get(r.rid, 0), nodes.get(r.rid)),
                running=list(running), now=10.0, rng=random.Random(0), **kw)
    return [reqs.index(r) for r in out]


def test_schedule_policies_order_the_queue():
    a, b, c = req(10, max_new=4, priority=1), req(30, max_new=64, priority=5), req(20, max_new=16)
    reqs = [a, b, c]
    assert ranked("fcfs", reqs) == [0, 1, 2]
    assert ranked("lpm", reqs, {c.rid: 12, b.rid: 3}) == [2, 1, 0]
    assert ranked("shortest-prefill-first", reqs, {b.rid: 25}) == [1, 0, 2]  # 5, 10, 20 new
    assert ranked("lof", reqs) == [1, 2, 0]
    assert ranked("priority", reqs) == [1, 0, 2]
    assert ranked("priority", reqs, low_priority_first=True) == [2, 0, 1]
    assert ranked("lpm", reqs, by_priority=True) == [1, 0, 2]
    assert sorted(ranked("random", reqs)) == [0, 1, 2]
    assert set(POLICIES) == set(ServerConfig.__dataclass_fields__["schedule_policy"]
                                .metadata["choices"])


def test_hrrn_prefers_long_waits_over_short_jobs():
    short_new, long_old = req(10, arrival=9.99), req(500, arrival=0.0)
    assert ranked("hrrn", [short_new, long_old]) == [1, 0]
    assert ranked("hrrn", [req(500, arrival=9.99), req(10, arrival=9.99)]) == [1, 0]


def test_routing_key_runs_live_keys_first_then_groups_by_key():
    reqs = [req(5, key="x"), req(5, key="y"), req(5, key="x"), req(5, key="z"), req(5, key="y")]
    assert ranked("routing-key", reqs, running=[req(5, key="z")]) == [3, 0, 2, 1, 4]


def test_dfs_weight_groups_shared_prefixes_heaviest_first():
    root = SimpleNamespace(parent=None)
    light, heavy = SimpleNamespace(parent=root), SimpleNamespace(parent=root)
    reqs = [req(5), req(5), req(5), req(5)]
    nodes = {reqs[0].rid: light, reqs[1].rid: heavy, reqs[2].rid: root, reqs[3].rid: heavy}
    assert ranked("dfs-weight", reqs, nodes=nodes) == [2, 1, 3, 0]


def test_retraction_policies_pick_their_victim():
    running = [req(50, priority=3), req(10, priority=1), req(50, priority=2)]
    running[0].output_ids = [1, 2, 3]
    assert retraction_victim(None, running) == 2
    assert retraction_victim("length", running) == 2  # longest prompt, then shortest output
    assert retraction_victim("priority", running) == 1
    assert retraction_victim("priority", running, low_priority_first=True) == 0


def test_priority_policy_in_the_scheduler():
    outs: dict = {}
    sched = make_sched(rows=1, schedule_policy="priority")
    low, high = make_req([1, 2, 3], outs), make_req([4, 5, 6], outs)
    high.priority = 9
    order_seen = []
    for r in (low, high):
        r.sink = lambda o, rid=r.rid: (outs[rid].append(o), order_seen.append(rid))
    run(sched, [low, high], outs)
    assert order_seen[0] == high.rid, "one row: the higher priority runs first"


def test_schedule_conservativeness_scales_the_decode_reserve():
    outs: dict = {}
    # 40 slots: one request running with 32 tokens to go; a newcomer needs its prompt + reserve
    for factor, admitted in ((1.0, False), (0.1, True)):
        sched = make_sched(num_slots=48, schedule_conservativeness=factor)
        first = make_req(list(range(1, 9)), outs, max_new=32)
        sched.submit([first])
        sched.step()
        sched.submit([make_req(list(range(1, 9)), outs, max_new=64)])
        sched.step()
        assert (len(sched.running) == 2) is admitted, factor


def test_show_time_cost_turns_the_step_timer_on(monkeypatch):
    monkeypatch.delenv("ENGINE_STEP_TIMING", raising=False)
    assert isinstance(make_sched(show_time_cost=True).timer, StepTimer)
    assert not isinstance(make_sched().timer, StepTimer)


def test_sampling_defaults_from_the_model_and_preferred_params(tmp_path):
    (tmp_path / "generation_config.json").write_text(json.dumps(
        {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "eos_token_id": 2}))
    model = ServerConfig(sampling_defaults="model")
    assert sampling_defaults(model, str(tmp_path)) == {"temperature": 0.6, "top_p": 0.9,
                                                      "top_k": 20}
    assert sampling_defaults(ServerConfig(sampling_defaults="openai"), str(tmp_path)) == {}
    preferred = ServerConfig(preferred_sampling_params='{"temperature": 0.2, "min_p": 0.1}')
    assert sampling_defaults(preferred, str(tmp_path))["temperature"] == 0.2
    with pytest.raises(ConfigError, match="unknown sampling parameter 'warmth'"):
        sampling_defaults(ServerConfig(preferred_sampling_params='{"warmth": 1}'), None)
    sp = to_sampling_params({"temperature": None, "top_k": 5},
                            defaults={"temperature": 0.6, "top_k": 20})
    assert (sp.temperature, sp.top_k) == (0.6, 5), "the request's own values win"


def test_auto_truncate_keeps_the_end_of_the_prompt():
    rt = SimpleNamespace(context_len=10, kv_capacity=100)
    ids = list(range(20))
    assert Runtime.truncate(rt, ids, SamplingParams(max_new_tokens=4)) == ids[-6:]
    assert Runtime.truncate(rt, ids, SamplingParams(max_new_tokens=None)) == ids[-9:]
    assert Runtime.truncate(rt, ids[:5], SamplingParams(max_new_tokens=4)) == ids[:5]


def test_cache_report_and_stream_merging():
    s = SeqState(index=0, prompt_index=0, prompt_tokens=10, completion_tokens=3,
                 cached_tokens=8)
    assert "prompt_tokens_details" not in usage([s])
    assert usage([s], cache_report=True)["prompt_tokens_details"] == {"cached_tokens": 8}
    merged = merge_outputs(ReqOutput("r", "a", [1], [-0.1]),
                           ReqOutput("r", "b", [2], [-0.2], finished=True))
    assert (merged.text, merged.token_ids, merged.logprobs, merged.finished) == \
        ("ab", [1, 2], [-0.1, -0.2], True)


def test_decode_graph_sizes():
    assert graph_buckets(20) == [1, 2, 4, 8, 12, 16, 20]
    assert graph_buckets(20, (16, 4, 64)) == [4, 16]
    assert graph_buckets(8, (32,)) == [1]


def test_base_gpu_id_picks_the_device(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert model_runner.pick_device("cuda", 2) == torch.device("cuda:2")
    assert model_runner.pick_device("auto", 3) == torch.device("cuda:3")
    assert model_runner.pick_device("cuda:1", 3) == torch.device("cuda:1")
    with pytest.raises(ConfigError, match="has 4 GPUs"):
        model_runner.pick_device("cuda", 4)


def test_watchdog_trips_on_a_stuck_forward_and_dumps_every_stack(capfd):
    stuck = threading.Event()
    dog = Watchdog(0.3, soft_timeout=0.1, on_stuck=stuck.set)
    fast = dog.wrap(lambda: time.sleep(0.01))
    fast()
    time.sleep(0.4)
    assert not dog.tripped, "idle time does not count"
    dog.wrap(lambda: time.sleep(1.0))()
    assert stuck.is_set() and dog.tripped
    err = capfd.readouterr().err
    assert err.count("hread 0x") >= 4, "two dumps (soft, then hard) of every thread"
    assert "test_options.py" in err, "the stuck thread's stack is in the dump"
    dog.stop()


def test_the_watchdog_times_the_overlap_schedulers_wait_too():
    """The overlap scheduler waits for a forward outside ``forward`` (``synchronize``): a
    device stuck there must trip the watchdog as a stuck forward does."""
    from types import SimpleNamespace

    from engine.runtime.watchdog import watch_forwards

    stuck = threading.Event()
    runner = SimpleNamespace(forward=lambda batch: None, synchronize=lambda e: time.sleep(0.6))
    dog = watch_forwards(runner, 0.2, None)
    dog.on_stuck = stuck.set
    runner.synchronize(None)
    assert stuck.is_set() and dog.tripped
    dog.stop()
    bare = SimpleNamespace(forward=lambda batch: None)  # a runner without it still works
    watch_forwards(bare, 5.0, None).stop()


def test_chat_template_from_a_file_or_inline(tmp_path):
    from engine.models.tokenizer import read_chat_template

    path = tmp_path / "t.jinja"
    path.write_text("{{ messages[0]['content'] }}")
    assert read_chat_template(str(path)) == "{{ messages[0]['content'] }}"
    assert read_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")
    with pytest.raises(ConfigError, match="no such file, and not a Jinja template"):
        read_chat_template("chatml")
    with pytest.raises(ConfigError, match="not a valid Jinja template"):
        read_chat_template("{% for m in messages %}")


def _gpt2_dir(tmp_path):
    vocab = {t: i for i, t in enumerate(["<|endoftext|>", "h", "i", "hi", "Ġ", "Ġh"])}
    (tmp_path / "vocab.json").write_text(json.dumps(vocab))
    (tmp_path / "merges.txt").write_text("#version: 0.2\nh i\nĠ h\n")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "GPT2Tokenizer", "eos_token": "<|endoftext|>"}))
    return str(tmp_path)


def test_tokenizer_mode_slow_asks_for_the_python_tokenizer(tmp_path, monkeypatch):
    import transformers

    from engine.models.tokenizer import Tokenizer

    asked = []
    real = transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained",
                        lambda *a, **kw: asked.append(kw.get("use_fast", True)) or real(*a, **kw))
    mc = SimpleNamespace(model_path=_gpt2_dir(tmp_path), gguf_file=None, eos_token_ids=())
    Tokenizer.load(mc, mode="auto")
    slow = Tokenizer.load(mc, mode="slow", chat_template="{{ messages[0]['content'] }}")
    assert asked == [True, False]
    assert slow.encode("hi", add_special_tokens=False) == [3]
    assert slow.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == "hi"
    gguf = SimpleNamespace(model_path=str(tmp_path), gguf_file="m.gguf", eos_token_ids=())
    with pytest.raises(ConfigError, match="GGUF's tokenizer is built as a fast tokenizer only"):
        Tokenizer.load(gguf, mode="slow")


def test_a_model_needing_its_own_code_is_refused(tmp_path):
    from engine.models.parsing import refuse_remote_code

    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "acme_secret", "auto_map": {"AutoConfig": "modeling.AcmeConfig"}}))
    with pytest.raises(ConfigError, match="never runs a model's code, --trust-remote-code or "
                                          "not"):
        refuse_remote_code(str(tmp_path))
    (tmp_path / "config.json").write_text(json.dumps(
        {"model_type": "llama", "auto_map": {"AutoConfig": "x.Y"}}))
    refuse_remote_code(str(tmp_path))  # a known type loads as that type


def test_deterministic_inference_needs_batch_invariant_attention_and_goes_row_by_row():
    from engine.runtime.linear import Linear, dense_linear

    layer = Linear(8, 4)
    fake = SimpleNamespace(prefill_backend=SimpleNamespace(batch_invariant=True),
                           decode_backend=SimpleNamespace(batch_invariant=False),
                           attention_backend_names=("torch_native", "flex_attention"),
                           model=torch.nn.Sequential(layer))
    with pytest.raises(ConfigError, match="decode attention backend flex_attention has no "
                                          "batch-invariant path"):
        model_runner.ModelRunner._make_batch_invariant(fake)
    fake.decode_backend.batch_invariant = True
    model_runner.ModelRunner._make_batch_invariant(fake)
    assert layer.row_by_row
    torch.nn.init.normal_(layer.weight)
    x = torch.randn(5, 8)
    assert torch.equal(layer(x), torch.cat([dense_linear(x[i:i + 1], layer.weight)
                                            for i in range(5)]))  # each row alone


def test_time_stats_phases_add_up_exactly_whatever_the_stamps():
    import random
    from engine.runtime.request import ReqOutput
    from engine.server.generation import time_stats_record

    rng = random.Random(0)
    for _ in range(2000):
        start = rng.uniform(0, 1e5)
        stamps = sorted(start + rng.uniform(0, 2) for _ in range(5))
        arrival, scheduled, first, first_http, now = stamps
        out = ReqOutput(rid="r", time_stats={"arrival": arrival, "scheduled": scheduled,
                                             "first_token": first})
        rec = time_stats_record(out, start, first_http, now)
        assert abs(rec["ttft"] + rec["decode"] - rec["e2e"]) < 1e-9, rec
        assert rec["queue"] + rec["prefill"] + rec["handover"] <= rec["ttft"] + 1e-9, rec
    rec = time_stats_record(ReqOutput(rid="r"), 1.0, None, 2.0)
    assert rec["queue"] is None and rec["ttft"] is None and rec["e2e"] == 1000.0
