"""Which reasoning parser a chat template calls for: the ordered rules of the fact sheet §4.

Only the template text is known here, so rules that read the tokenizer vocabulary are applied
to the template text.
"""

from __future__ import annotations

import re

from engine.api.parsers import POLICIES, template_policy


def _glm53(t: str) -> bool:
    return ("[gMASK]<sop>" in t and "Reasoning Effort:" in t and "enable_thinking" not in t
            and all(s in t for s in ("<tool_call>", "<arg_key>", "<arg_value>")))

_STEP3P5 = re.compile(r"Step-?3(\.|p)?[57]", re.IGNORECASE)
_HUNYUAN_TOOLS = re.compile(r"<tool_calls(?::[^>\s]+)?>")


def detect_reasoning_parser(chat_template: str | None) -> str | None:
    """The reasoning-parser name the fact sheet's §4 step 3 rules pick for a chat template, or
    ``None``. Rules that read the tokenizer vocabulary are applied to the template text."""
    t = chat_template or ""
    if not t:
        return None
    pol = template_policy(t)

    def has(*parts: str) -> bool:
        return all(p in t for p in parts)

    en_on = pol == POLICIES["enable_thinking"]
    en_off = pol == POLICIES["explicit_enable_thinking"]
    args = has("<arg_key>", "<arg_value>")
    glm45 = (
        ("[gMASK]<sop>" in t or "/nothink" in t or "/think" in t) and "<tool_call>" in t
        and en_on and ("<|user|>" in t or "<|endoftext|>" in t)
    ) or _glm53(t)
    hunyuan = (
        (bool(_HUNYUAN_TOOLS.search(t)) and "<tool_sep>" in t)
        or (pol == POLICIES["effort_not_off"] and args)
        or has("reasoning_effort", "interleaved_thinking")
    )
    rules: list[tuple[bool, str]] = [
        (has("<ifm|think>", "<ifm|tool_calls>", "<ifm|tool_call>"), "k2_horizon"),
        ("<|inner_prefix|>" in t, "apertus2509"),
        ("<|channel>" in t, "gemma4"),
        ("◁think▷" in t, "kimi"),
        ("default_thinking_sys" in t and en_on, "interns1"),
        (pol == POLICIES["effort_given"], "mistral"),
        ("<|channel|>" in t, "gpt-oss"),
        ("<|tool_calls_section_begin|>" in t, "kimi_k2"),
        (has("truncate_history_thinking", "defer_loading") and en_on, "granite_thinking_parser"),
        ("truncate_history_thinking" in t and en_on, "nemotron_3"),
        (glm45, "glm45"),
        (hunyuan, "hunyuan"),
        ((args and ("unescaped XML-like object" in t
                    or "All available function signatures are listed below" in t))
         or (en_off and args and not hunyuan), "poolside_v1"),
        (en_off, "mimo"),
        ("<mm:think>" in t or "]<]minimax[>[" in t, "minimax-m3"),
        ("<minimax:tool_call>" in t, "minimax"),
        (bool(_STEP3P5.search(t))
         or has("reasoning_effort", "Reasoning: ", "<function=", "<parameter="), "step3p5"),
        ("<steptml:invoke" in t or has("<｜tool_calls_begin｜>", "<｜tool_sep｜>"), "step3"),
        (has("<role>SYSTEM</role>", "<role>ASSISTANT</role>", "<|role_end|>") and args, "ling3"),
        (en_on, "qwen3"),
        ("<｜DSML｜ calls>" in t, "deepseek-v41"),
        ("<｜DSML｜tool_calls>" in t, "deepseek-v4"),
        (pol == POLICIES["explicit_thinking"], "deepseek-v3"),
        (pol == POLICIES["always"], "deepseek-r1"),
        (("<think>" in t or "</think>" in t) and "<|tool_call_start|>" not in t, "deepseek-r1"),
    ]
    return next((name for hit, name in rules if hit), None)
