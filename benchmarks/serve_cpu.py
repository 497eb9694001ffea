"""Serving benchmark on CPU through a real ``engine serve``: prints a table.

Measures (greedy, ``ignore_eos`` so every request makes exactly ``--max-tokens`` tokens):

* start-up: seconds from launching ``engine serve`` to the first 200 on ``/health``
  (the server's own "ready" log line gives the same figure from inside);
* aggregate throughput with 8 concurrent requests (output tokens / wall time), and the mean
  per-step decode time it implies;
* batch-1 decode: ms per output token of one request alone (after its first token);
* time to first token of a 512-token prompt (streamed ``/generate``, radix cache flushed);
* then, in the same run with the server stopped, transformers fp32 decoding the same GGUF at
  batch 1 and at the concurrency (``--no-transformers`` skips it), and the ratios.

    python benchmarks/serve_cpu.py [--max-tokens 64] [--concurrency 8] [-- extra serve flags]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from _server import free_port, wait_ready  # this folder, on the path when run as a script

PROMPTS = ["Write a short story about a robot learning to paint.",
           "Explain how a bicycle works.", "List some facts about the planet Mars.",
           "Describe a walk through a forest in autumn.", "What makes a good cup of tea?",
           "Tell me about the history of the printing press.",
           "Give advice to a new gardener.", "Describe the sound of the ocean."]


def stream_generate(client: httpx.Client, body: dict) -> tuple[float, float, int]:
    """(time to first token, total time, output tokens) of one streamed request."""
    t0 = time.perf_counter()
    ttft, n = None, 0
    with client.stream("POST", "/generate", json={**body, "stream": True}) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            item = json.loads(line[6:])
            if ttft is None and item["output_ids"]:
                ttft = time.perf_counter() - t0
            n = len(item["output_ids"])
    return ttft or 0.0, time.perf_counter() - t0, n


def transformers_steps(batch: int) -> dict[int, float]:
    """transformers fp32 (SDPA, its KV cache) on the same GGUF: ms per decode step at batch 1
    and ``batch`` (the loop of benchmarks/decode_cpu.py)."""
    import torch
    from transformers import AutoModelForCausalLM

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from decode_cpu import transformers_side

    from engine.config import ServerConfig
    from engine.assembly import Assembly

    mc = Assembly(ServerConfig()).model_config()
    model = AutoModelForCausalLM.from_pretrained(mc.model_path, gguf_file=mc.gguf_file,
                                                 dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    prompt = list(range(1000, 1064))
    return {b: transformers_side(prompt, b, 32, model) for b in (1, batch)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--no-transformers", action="store_true",
                    help="skip the transformers reference measured after the server stops")
    ap.add_argument("serve_args", nargs="*", help="extra flags for engine serve (after --)")
    args = ap.parse_args()

    port = free_port()
    log = tempfile.NamedTemporaryFile(prefix="engine-bench-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "engine.cli.main", "serve", "--port", str(port),
           "--max-total-tokens", "32768", *args.serve_args]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                            env=dict(os.environ, PYTHONWARNINGS="ignore"))
    url = f"http://127.0.0.1:{port}"
    try:
        if not wait_ready(proc, url, log.name, poll_s=0.2):
            return 1
        startup = time.perf_counter() - t0
        client = httpx.Client(base_url=url, timeout=600)
        sp = {"temperature": 0, "max_new_tokens": args.max_tokens, "ignore_eos": True}

        # batch 1 decode
        _, total, n = stream_generate(client, {"text": PROMPTS[0], "sampling_params": sp})
        ttft1, total, n = stream_generate(client, {"text": PROMPTS[1], "sampling_params": sp})
        b1_ms = (total - ttft1) / max(1, n - 1) * 1000

        # aggregate throughput with N concurrent requests
        client.post("/flush_cache")
        bodies = [{"text": PROMPTS[i % len(PROMPTS)] + f" ({i})", "sampling_params": sp}
                  for i in range(args.concurrency)]
        t1 = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            results = list(pool.map(lambda b: stream_generate(client, b), bodies))
        wall = time.perf_counter() - t1
        tokens = sum(r[2] for r in results)
        decode_steps = [(r[1] - r[0]) / max(1, r[2] - 1) * 1000 for r in results]

        # TTFT of a long prompt
        client.post("/flush_cache")
        tok_ids = list(range(1000, 1000 + args.prompt_tokens))
        ttfts = []
        for _ in range(3):
            client.post("/flush_cache")
            ttft, _, _ = stream_generate(client, {"input_ids": tok_ids, "sampling_params": {
                **sp, "max_new_tokens": 1}})
            ttfts.append(ttft)
        info = client.get("/get_server_info").json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        os.unlink(log.name)

    rows = [
        ("server start-up to ready", f"{startup:.1f} s"),
        ("batch-1 decode", f"{b1_ms:.1f} ms/token ({1000 / b1_ms:.1f} tok/s)"),
        (f"{args.concurrency} concurrent requests x {args.max_tokens} tokens",
         f"{tokens / wall:.1f} tok/s aggregate ({wall:.1f} s wall)"),
        (f"  per-request decode step at {args.concurrency}",
         f"{statistics.mean(decode_steps):.1f} ms/step (mean)"),
        (f"TTFT, {args.prompt_tokens}-token prompt",
         f"{statistics.median(ttfts) * 1000:.0f} ms (median of 3; "
         f"chunk {info['runtime']['chunked_prefill_size']})"),
    ]
    if not args.no_transformers:  # the same run, the server stopped: transformers fp32 decode
        hf = transformers_steps(args.concurrency)
        rows += [("transformers fp32, batch-1 decode", f"{hf[1]:.1f} ms/token"),
                 (f"transformers fp32, batch-{args.concurrency} decode",
                  f"{hf[args.concurrency]:.1f} ms/step "
                  f"({args.concurrency * 1000 / hf[args.concurrency]:.1f} tok/s)"),
                 ("ours vs transformers, batch 1", f"{hf[1] / b1_ms:.2f}x"),
                 (f"ours through HTTP vs transformers batch {args.concurrency}",
                  f"{(tokens / wall) / (args.concurrency * 1000 / hf[args.concurrency]):.2f}x "
                  "(aggregate tok/s)")]
    width = max(len(r[0]) for r in rows)
    print(f"engine serve on {info['runtime']['device']}, {info['runtime']['dtype']}, "
          f"torch threads {os.environ.get('OMP_NUM_THREADS', 'default')}")
    print(f"{'measure'.ljust(width)} | value")
    print(f"{'-' * width}-|-{'-' * 40}")
    for name, value in rows:
        print(f"{name.ljust(width)} | {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
