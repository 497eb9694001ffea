"""Accuracy of our CPU serving path and of llama.cpp on the default GGUF, against float32:
teacher-forced over a held-out English text, top-1 agreement and mean KL(float32 || other).

* float32 reference: our ModelRunner with ``--quantization unquant`` (the GGUF's blocks
  dequantized to float32 once, dense float32 matmuls);
* ours: the ModelRunner as ``engine serve`` builds it by default (the ``gguf`` plugin on CPU),
  plus any ``--ours-args`` (engine serve flags, e.g. ``--ours-args "--gguf-kernel-max-rows 0"``;
  repeat ``--ours-args`` to compare several paths in one table);
* llama.cpp: ``Llama(model_path, logits_all=True, n_threads=2)`` from llama-cpp-python, in the
  venv benchmarks/cpu_vs_llamacpp.py installs (``<cache>/llamacpp-venv``), run as a subprocess
  that writes its logits to a .npy.

Every side sees the same token ids (our tokenizer). ``--mode decode`` (the default) feeds them
one token per forward, as decoding does (our batch-1 path: the blocks kernels); ``--mode
extend`` feeds ``--chunk`` tokens per forward (prefill; ours takes the dense copy above
``--gguf-kernel-max-rows`` tokens).

    python benchmarks/cpu_accuracy.py [--mode decode|extend] [--ours-args "..."]...
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

import numpy as np

# Held-out text: written for this benchmark (not model output, not from the model's data).
TEXT = """\
The lighthouse on the northern cape was built in 1871, after three ships were lost on the
reef in a single winter. Its first keeper, a former schoolteacher named Agnes Holt, kept a
logbook in which she recorded the weather every four hours, the ships that passed, and the
birds that struck the lantern glass during the autumn migration. The logbook survives in the
county archive, and historians have used it to reconstruct the storms of that decade with
surprising precision.

Life at the station was quiet but never idle. The lamp burned whale oil at first, then
kerosene, and every evening the wick had to be trimmed and the lens polished so that the beam
would carry eighteen miles out to sea. Supplies came by boat once a fortnight when the sea
allowed it; in bad years the keepers went for six weeks without fresh bread. Holt planted a
small garden behind the stone wall, where cabbages and potatoes grew in soil carried up from
the valley in sacks.

In 1903 the station was connected to the mainland by a telegraph cable, and the keepers could
report wrecks within minutes instead of days. The cable broke often, usually when ice formed
on the poles, and repairing it became part of the routine. Electric light arrived in 1928.
The new lamp needed less care, and the staff was reduced from three keepers to two.

The station was automated in 1974. Today the tower is a museum, and visitors can climb the
hundred and twelve steps to the gallery. On clear days they can see the islands to the west
and, far to the north, the smoke of the ferries crossing to the harbour town. The logbook is
displayed in a glass case at the foot of the stairs, open at a page from November 1872, when
Holt wrote that the wind had blown so hard for three days that the whole tower hummed like a
bell.
"""

LLAMA_CHILD = r"""
import sys, numpy as np
from llama_cpp import Llama
path, ids_file, out_file, mode, chunk = sys.argv[1:6]
ids = np.load(ids_file).tolist()
llm = Llama(model_path=path, logits_all=True, n_threads=2, n_threads_batch=2,
            n_ctx=max(512, len(ids) + 8), n_batch=512, verbose=False)
step = 1 if mode == "decode" else int(chunk)
for i in range(0, len(ids), step):
    llm.eval(ids[i:i + step])
np.save(out_file, np.asarray(llm.scores[:len(ids)], dtype=np.float32))
"""


def our_logits(argv: list[str], ids: list[int], mode: str, chunk: int) -> np.ndarray:
    """Logits of every position of ``ids`` (row i predicts ids[i + 1]) from a ModelRunner
    configured by ``engine serve`` flags ``argv``."""
    import dataclasses

    import torch
    from engine.cli.args import parse_config
    from engine.plugins.registry import Registry
    from engine.runtime.model_runner import ModelRunner
    from engine.testing.batches import BatchBuilder

    config = parse_config(argv, Registry())
    if config.max_total_tokens is None:
        config = dataclasses.replace(config, max_total_tokens=max(2048, 2 * len(ids)))
    runner = ModelRunner(config)
    builder = BatchBuilder(runner.req_to_token, runner.pool.num_slots, runner.page_size)
    row = builder.new_request()
    out = []
    with torch.inference_mode():
        if mode == "decode":
            out.append(runner.forward(builder.extend([(row, ids[:1])])))
            for t in ids[1:]:
                out.append(runner.forward(builder.decode([(row, t)])))
        else:
            for i in range(0, len(ids), chunk):
                out.append(runner.forward(builder.extend([(row, ids[i:i + chunk])],
                                                         all_logits=True)))
    logits = torch.cat(out).float().numpy()
    del runner
    return logits


def llama_logits(gguf: str, ids: list[int], mode: str, chunk: int) -> np.ndarray:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from cpu_vs_llamacpp import cache_dir, llama_venv

    py = llama_venv(cache_dir())
    with tempfile.TemporaryDirectory() as tmp:
        ids_file, out_file = os.path.join(tmp, "ids.npy"), os.path.join(tmp, "logits.npy")
        np.save(ids_file, np.asarray(ids, dtype=np.int64))
        subprocess.run([py, "-c", LLAMA_CHILD, gguf, ids_file, out_file, mode, str(chunk)],
                       check=True)
        return np.load(out_file)


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def compare(ref: np.ndarray, other: np.ndarray) -> tuple[float, float]:
    """(top-1 agreement %, mean KL(ref || other) in nats) over the positions."""
    lp, lq = log_softmax(ref), log_softmax(other)
    top1 = float((lp.argmax(-1) == lq.argmax(-1)).mean() * 100)
    kl = float((np.exp(lp) * (lp - lq)).sum(-1).mean())
    return top1, kl


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mode", choices=("decode", "extend"), default="decode")
    ap.add_argument("--chunk", type=int, default=512, help="tokens per forward, --mode extend")
    ap.add_argument("--ours-args", action="append", default=None,
                    help="engine serve flags of one of our paths (repeatable; default: none, "
                         "the default path)")
    ap.add_argument("--no-llama", action="store_true", help="skip llama.cpp")
    args = ap.parse_args()
    paths = args.ours_args or [""]

    from engine.models.config import default_model_path
    from transformers import AutoTokenizer

    gguf = default_model_path()
    tok = AutoTokenizer.from_pretrained(os.path.dirname(gguf), gguf_file=os.path.basename(gguf))
    ids = tok.encode(TEXT, add_special_tokens=False)

    ref = our_logits(["--quantization", "unquant"], ids, args.mode, args.chunk)
    rows = []
    for extra in paths:
        logits = our_logits(shlex.split(extra), ids, args.mode, args.chunk)
        rows.append((f"ours (engine serve {extra})" if extra else "ours (engine serve default)",
                     *compare(ref[:-1], logits[:-1])))
    if not args.no_llama:
        rows.append(("llama.cpp (llama-cpp-python, Q4_1)",
                     *compare(ref[:-1], llama_logits(gguf, ids, args.mode, args.chunk)[:-1])))
    print(f"{os.path.basename(gguf)}, {len(ids) - 1} teacher-forced positions, mode {args.mode}"
          + (f" (chunks of {args.chunk})" if args.mode == "extend" else " (one token a forward)")
          + "; reference: ours float32 (--quantization unquant)")
    print("| path | top-1 agreement with float32 % | mean KL(float32 ‖ path) nats |")
    print("|---|---|---|")
    for name, top1, kl in rows:
        print(f"| {name} | {top1:.1f} | {kl:.3g} |")


if __name__ == "__main__":
    main()
