"""Code-completion (fill-in-the-middle) templates: how ``/v1/completions`` joins a ``prompt`` and
its ``suffix`` into one prompt for a code model (``--completion-template``).

A template is three marker strings and where the middle marker goes: ``middle`` gives
``begin + prompt + middle + suffix + end`` (DeepSeek Coder), ``end`` gives
``begin + prompt + end + suffix + middle`` (StarCoder, Qwen Coder); the model writes the missing
middle after the last marker. ``--completion-template`` is a built-in name or a JSON file
``{"fim_begin_token", "fim_middle_token", "fim_end_token", "fim_position": "MIDDLE"|"END"}``
(SGLang's format; a ``name`` key is optional).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from engine.errors import ConfigError

POSITIONS = ("middle", "end")


@dataclass(frozen=True)
class CompletionTemplate:
    name: str
    begin: str
    middle: str
    end: str
    position: str  #: where ``middle`` goes: "middle" (between prompt and suffix) or "end"

    def format(self, prompt: str, suffix: str) -> str:
        if self.position == "middle":
            return f"{self.begin}{prompt}{self.middle}{suffix}{self.end}"
        return f"{self.begin}{prompt}{self.end}{suffix}{self.middle}"


BUILTIN: dict[str, CompletionTemplate] = {t.name: t for t in (
    CompletionTemplate("deepseek_coder", "<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>",
                       "middle"),
    CompletionTemplate("star_coder", "<fim_prefix>", "<fim_middle>", "<fim_suffix>", "end"),
    CompletionTemplate("qwen_coder", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>",
                       "end"),
)}


def load_completion_template(spec: str) -> CompletionTemplate:
    """The template ``--completion-template spec`` names: a built-in name, or a JSON file.
    Raises :class:`ConfigError` (exit status 2) naming the known templates otherwise."""
    if spec in BUILTIN:
        return BUILTIN[spec]
    where = f"--completion-template {spec}"
    if not os.path.isfile(spec):
        raise ConfigError(f"{where}: not a built-in template ({', '.join(BUILTIN)}) nor a "
                          "JSON template file")
    try:
        with open(spec, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read the template file: {exc}") from None
    keys = ("fim_begin_token", "fim_middle_token", "fim_end_token", "fim_position")
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) for k in keys):
        raise ConfigError(f"{where}: a template file is a JSON object with the strings "
                          f"{', '.join(keys)}")
    position = data["fim_position"].lower()
    if position not in POSITIONS:
        raise ConfigError(f"{where}: fim_position must be MIDDLE or END, got "
                          f"{data['fim_position']!r}")
    name = data.get("name") if isinstance(data.get("name"), str) else \
        os.path.splitext(os.path.basename(spec))[0]
    return CompletionTemplate(name, data["fim_begin_token"], data["fim_middle_token"],
                              data["fim_end_token"], position)
