"""Custom logit processors (``--enable-custom-logit-processor``): named, installed code that a
request may select, never code that a request carries.

SGLang's requests carry ``custom_logit_processor`` as ``{"callable": "<hex of a dill-pickled
class>"}``: unpickling it runs whatever the client wrote, inside the server. This server keeps the
field and its shape but the ``callable`` is a *name*: a processor built into the core
(:data:`BUILTIN`) or registered by an installed distribution under the entry-point group
``engine.logit_processors`` (the entry point's name is the processor's; its object is a
processor, or a class whose instances are). Serialized code is refused with HTTP 400.

A processor is called as ``processor(logits, params) -> logits``: ``logits`` float32 ``[B, V]``
holds the rows of the requests that chose it (after penalties, before a grammar mask and
before log-probabilities are taken), ``params`` one dict per row: the request's
``custom_params`` plus ``"__req__"``, the request (its ``origin_input_ids`` and ``output_ids``).
It may change ``logits`` in place; it returns the rows to use. A processor that raises fails
the requests of its rows alone; one with a ``check(params, vocab_size)`` method has each
request's ``custom_params`` checked on arrival (what it raises is the request's HTTP 400).
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any, Callable, Mapping

import torch

from engine.errors import ConfigError
from engine.runtime.sampling import InvalidParam

log = logging.getLogger("engine.runtime")

ENTRY_POINT_GROUP = "engine.logit_processors"

LogitProcessor = Callable[[torch.Tensor, list[dict[str, Any]]], torch.Tensor]


class DisallowedTokens:
    """``custom_params: {"token_ids": [...]}``: those tokens are never chosen (logit -inf)."""

    def check(self, params: Mapping[str, Any], vocab_size: int) -> None:
        ids = params.get("token_ids", [])
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                and 0 <= t < vocab_size for t in ids):
            raise ValueError(f"custom_params.token_ids must be a list of token ids below "
                             f"{vocab_size}")

    def __call__(self, logits: torch.Tensor, params: list[dict[str, Any]]) -> torch.Tensor:
        for i, p in enumerate(params):
            logits[i, p.get("token_ids", [])] = float("-inf")
        return logits


BUILTIN: dict[str, LogitProcessor] = {"disallowed_tokens": DisallowedTokens()}


def load_processors() -> dict[str, LogitProcessor]:
    """The built-in processors and those installed under :data:`ENTRY_POINT_GROUP` (loaded
    once, at start-up). A name given twice, or an entry point that does not load into a
    callable, is a :class:`ConfigError`."""
    found: dict[str, LogitProcessor] = dict(BUILTIN)
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        where = f"logit processor {ep.name!r} ({ep.value})"
        if ep.name in found:
            raise ConfigError(f"{where}: the name is already taken")
        try:
            obj = ep.load()
        except Exception as exc:  # noqa: BLE001 - reported as a start-up error
            raise ConfigError(f"{where} does not load: {type(exc).__name__}: {exc}") from None
        if isinstance(obj, type):
            obj = obj()
        if not callable(obj):
            raise ConfigError(f"{where} is not callable")
        found[ep.name] = obj
    log.info("custom logit processors: %s", ", ".join(sorted(found)))
    return found


@dataclass(frozen=True)
class ChosenProcessor:
    """One request's processor and its ``custom_params``."""

    name: str
    processor: LogitProcessor
    params: Mapping[str, Any]


_HEX = re.compile(r"[0-9a-fA-F]{16,}")


def choose(value: Any, params: Any, processors: dict[str, LogitProcessor] | None,
           vocab_size: int) -> ChosenProcessor | None:
    """The processor a request names in ``custom_logit_processor`` (``{"callable": NAME}``, as
    a JSON text or an object), with its ``custom_params``; None when it names none. Raises
    :class:`InvalidParam` naming the field (HTTP 400): the server runs without
    ``--enable-custom-logit-processor`` (``processors`` None), serialized code, an unknown name,
    ``custom_params`` that is not an object, or without a processor."""
    if value is None:
        if params is not None:
            raise InvalidParam("custom_params", "custom_params are the parameters of a custom "
                               "logit processor; this request names none "
                               "(custom_logit_processor)" if processors is not None else
                               "custom_params needs a server started with "
                               "--enable-custom-logit-processor")
        return None
    field = "custom_logit_processor"
    if processors is None:
        raise InvalidParam(field, "custom logit processors are off: the server runs without "
                         "--enable-custom-logit-processor")
    spec = value
    if isinstance(value, str):
        try:
            spec = json.loads(value)
        except json.JSONDecodeError:
            spec = {"callable": value}
    name = spec.get("callable") if isinstance(spec, dict) else None
    known = ", ".join(sorted(processors))
    if not isinstance(name, str):
        raise InvalidParam(field, f'{field} must be {{"callable": NAME}} naming a registered '
                         f"processor ({known})")
    if name not in processors:
        if _HEX.fullmatch(name) or len(name) > 128:
            raise InvalidParam(field, f"{field} carries serialized Python code, which this server "
                             "never runs (unpickling it would let any client execute code in "
                             f'the server); name a registered processor instead: {{"callable": '
                             f'NAME}} with NAME one of {known}')
        raise InvalidParam(field, f"{field}: no processor named {name!r}; registered: {known}")
    if params is not None and not isinstance(params, dict):
        raise InvalidParam("custom_params", "custom_params must be a JSON object")
    processor = processors[name]
    check = getattr(processor, "check", None)
    if check is not None:
        try:
            check(params or {}, vocab_size)
        except (ValueError, TypeError) as exc:
            raise InvalidParam("custom_params", f"{name}: {exc}") from None
    return ChosenProcessor(name, processor, dict(params or {}))


def apply(logits: torch.Tensor, rows: list[Any], idx: list[int],
          errors: dict[int, Exception]) -> None:
    """Run each processor once over the rows ``idx`` that chose it (``rows[i].logit_processor``),
    in place; the rows of a processor that raises (or returns a wrong shape) go to ``errors``."""
    groups: dict[str, list[int]] = {}
    for i in idx:
        groups.setdefault(rows[i].logit_processor.name, []).append(i)
    for members in groups.values():
        chosen = rows[members[0]].logit_processor
        params = [{**rows[i].logit_processor.params, "__req__": rows[i]} for i in members]
        try:
            out = chosen.processor(logits[members], params)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(members),
                                                                         logits.shape[1]):
                raise ValueError(f"logit processor {chosen.name!r} returned no [rows, vocab] "
                                 "tensor")
            logits[members] = out.to(logits.dtype)
        except Exception as exc:  # noqa: BLE001 - these rows fail, the batch goes on
            for i in members:
                errors[i] = RuntimeError(f"custom logit processor {chosen.name!r} failed: "
                                         f"{type(exc).__name__}: {exc}")
