"""The offline API: ``Engine(model_path=...).generate(prompts, sampling_params)``.

It builds the same :class:`~engine.runtime.frontend.Runtime` as ``engine serve`` (model runner
+ continuous-batching scheduler) and steps the scheduler in the calling thread until every
prompt is done, so a list of prompts is batched exactly as concurrent HTTP requests are.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Sequence

from engine.config import ServerConfig
from engine.runtime.request import ReqOutput
from engine.runtime.sampling import SamplingParams

Prompts = str | Sequence[str] | Sequence[int] | Sequence[Sequence[int]]
ParamsLike = SamplingParams | dict[str, Any] | None


class Engine:
    """An in-process engine. Keyword arguments are :class:`~engine.config.ServerConfig` fields."""

    def __init__(self, model_path: str | None = None, *, runner: Any = None,
                 assembly: Any = None, **server_config_fields: Any) -> None:
        """Load the model (or take a ready ``ModelRunner`` as ``runner``; the scheduling options
        still come from the keyword arguments). ``assembly``: the
        :class:`~engine.assembly.Assembly` to take the plugins' products from (default: one
        built from the options; none with a ready ``runner``)."""
        from engine.runtime.frontend import Runtime

        known = {f.name for f in dataclasses.fields(ServerConfig)}
        unknown = sorted(set(server_config_fields) - known)
        if unknown:
            raise TypeError(f"unknown Engine option(s): {', '.join(unknown)}")
        self.config = ServerConfig(model_path=model_path, **server_config_fields)
        self.runtime = Runtime(self.config, assembly, runner=runner)
        self.tokenizer = self.runtime.tokenizer
        self._ids = itertools.count()

    def generate(self, prompts: Prompts,
                 sampling_params: ParamsLike | Sequence[ParamsLike] = None) -> list[dict[str, Any]]:
        """Generate for each prompt (text, or token ids); one dict per output sequence.

        ``sampling_params`` is one set for all prompts or a list with one per prompt. With
        ``n > 1`` a prompt yields ``n`` consecutive results. Each result holds ``text``,
        ``output_ids``, ``finish_reason`` (``{"type": "stop"|"length"|"abort", ...}``) and
        ``meta_info`` (``prompt_tokens``, ``completion_tokens``, ``cached_tokens``, and
        ``output_token_logprobs``/``output_top_logprobs`` when asked for, and
        ``output_token_ids_logprobs``: (id, log-probability) pairs of ``token_ids_logprob``; with
        ``logprob_start_len`` >= 0 also ``input_token_ids``, ``input_token_logprobs`` (None for
        token 0), ``input_top_logprobs`` and ``input_token_ids_logprobs``: the prompt's own,
        from that position on).
        """
        batch = _as_prompt_list(prompts)
        if isinstance(sampling_params, (list, tuple)):
            if len(sampling_params) != len(batch):
                raise ValueError(f"{len(sampling_params)} sampling_params for {len(batch)} "
                                 "prompts")
            params_list = [_as_params(p) for p in sampling_params]
        else:
            params_list = [_as_params(sampling_params)] * len(batch)
        results: dict[str, dict[str, Any]] = {}
        order: list[str] = []

        def sink(out: ReqOutput) -> None:
            res = results[out.rid]
            res["text"] += out.text
            res["output_ids"].extend(out.token_ids)
            res["meta_info"]["output_token_logprobs"].extend(out.logprobs)
            res["meta_info"]["output_top_logprobs"].extend(out.top_logprobs)
            if out.ids_logprobs:
                res["meta_info"].setdefault("output_token_ids_logprobs", []).extend(
                    out.ids_logprobs)
            if out.input_logprobs is not None:
                res["meta_info"].update(input_token_ids=out.input_token_ids,
                                        input_token_logprobs=out.input_logprobs,
                                        input_top_logprobs=out.input_top_logprobs,
                                        input_token_ids_logprobs=out.input_ids_logprobs)
            if out.finished:
                res["finish_reason"] = out.finish_reason
                res["meta_info"].update(prompt_tokens=out.prompt_tokens,
                                        completion_tokens=out.completion_tokens,
                                        cached_tokens=out.cached_tokens)
                if self.runtime.scheduler.spec is not None:
                    res["meta_info"].update(spec_verify_ct=out.spec_verify_ct,
                                            spec_accepted_tokens=out.spec_accepted_tokens)

        all_reqs = []
        for prompt, params in zip(batch, params_list):
            ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
            reqs = self.runtime.make_reqs(f"offline-{next(self._ids)}", ids, params, sink)
            for req in reqs:
                order.append(req.rid)
                results[req.rid] = {"text": "", "output_ids": [], "finish_reason": None,
                                    "meta_info": {"output_token_logprobs": [],
                                                  "output_top_logprobs": []}}
            all_reqs.extend(reqs)
        scheduler = self.runtime.scheduler
        scheduler.submit(all_reqs)
        while any(results[r]["finish_reason"] is None for r in order):
            if not scheduler.step():
                raise RuntimeError("the scheduler stopped with requests unfinished")
        out = []
        for rid in order:
            res = results[rid]
            if not (res["meta_info"]["output_token_logprobs"]):
                del res["meta_info"]["output_token_logprobs"], res["meta_info"][
                    "output_top_logprobs"]
            out.append(res)
        return out

    def shutdown(self) -> None:
        """Release the model and the KV cache."""
        runtime = getattr(self, "runtime", None)
        if runtime is not None:
            runtime.shutdown()
            self.runtime = None  # type: ignore[assignment]

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()


def _as_prompt_list(prompts: Prompts) -> list[str | list[int]]:
    if isinstance(prompts, str):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) and not isinstance(t, bool) for t in items):
        return [list(items)]  # type: ignore[arg-type]
    out: list[str | list[int]] = []
    for p in items:
        if isinstance(p, str):
            out.append(p)
        elif isinstance(p, (list, tuple)) and all(isinstance(t, int) for t in p):
            out.append(list(p))
        else:
            raise TypeError("prompts must be a string, a list of strings, or token id lists")
    return out


def _as_params(p: ParamsLike) -> SamplingParams:
    if p is None:
        return SamplingParams()
    if isinstance(p, SamplingParams):
        return dataclasses.replace(p).validate()
    if isinstance(p, dict):
        return SamplingParams.from_dict(p)
    raise TypeError(f"sampling_params must be a dict or SamplingParams, not {type(p).__name__}")
