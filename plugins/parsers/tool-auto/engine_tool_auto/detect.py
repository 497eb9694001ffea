"""Which tool-call parser a chat template calls for: the ordered rules of the fact sheet §4.

Only the template text is known here, so "the vocabulary has X" is tested on the template text.
"""

from __future__ import annotations

import re
from typing import Callable

_ET_OFF = (
    re.compile(
        r"if\s+not\s+enable_thinking\s+is\s+defined\s*%\}"
        r"\s*\{%-?\s*set\s+enable_thinking\s*=\s*false",
        re.I,
    ),
    re.compile(r"enable_thinking\s*\|\s*default\(\s*false\s*\)", re.I),
)
_TH_OFF = (
    re.compile(
        r"if\s+not\s+thinking\s+is\s+defined\s*%\}\s*\{%-?\s*set\s+thinking\s*=\s*false", re.I
    ),
    re.compile(r"(?<![\w.])thinking\s*\|\s*default\(\s*false\s*\)", re.I),
)
_THINKING_VAR = re.compile(r"(?<![\w.])thinking(?!\w)")
_STEP35 = re.compile(r"Step-?3(\.|p)?[57]", re.I)
_MINICPM = (re.compile(r"<function\s+name="), re.compile(r"<param\s+name="))


def _has(t: str, *parts: str) -> bool:
    return all(p in t for p in parts)


def enable_thinking_default_off(t: str) -> bool:
    return any(p.search(t) for p in _ET_OFF)


def enable_thinking_default_on(t: str) -> bool:
    return "enable_thinking" in t and not enable_thinking_default_off(t)


def thinking_default_off(t: str) -> bool:
    return any(p.search(t) for p in _TH_OFF)


def forces_reasoning(t: str) -> bool:
    """The reasoning-mode rules of §4.2 that mean "always"."""
    if _has(t, "<ifm|think>", "<ifm|think_fast>", "reasoning_effort") or "<|channel|>" in t:
        return True
    if "<|im_start|>assistant\\n<think>\\n" in t and not _THINKING_VAR.search(t) and (
        "enable_thinking" not in t
    ):
        return True
    return glm53(t)


def glm53(t: str) -> bool:
    return (
        _has(t, "[gMASK]<sop>", "Reasoning Effort:")
        and "enable_thinking" not in t
        and _has(t, "<tool_call>", "<arg_key>", "<arg_value>")
    )


def glm_family(t: str) -> bool:
    glm45 = (
        ("[gMASK]<sop>" in t or "/nothink" in t or "/think" in t)
        and "<tool_call>" in t
        and enable_thinking_default_on(t)
        and ("<|user|>" in t or "<|endoftext|>" in t)
    )
    return glm45 or glm53(t)


def hunyuan(t: str) -> bool:
    arg_tokens = _has(t, "<arg_key>", "<arg_value>")
    effort = _has(t, "reasoning_effort", "reasoning_mode_token", "no_think")
    return (
        (re.search(r"<tool_calls[^>]*>", t) is not None and "<tool_sep>" in t)
        or (effort and arg_tokens)
        or _has(t, "reasoning_effort", "interleaved_thinking")
    )


def poolside(t: str) -> bool:
    arg_tokens = _has(t, "<arg_key>", "<arg_value>")
    prose = "unescaped XML-like object" in t or (
        "All available function signatures are listed below" in t
    )
    return arg_tokens and (prose or (enable_thinking_default_off(t) and not hunyuan(t)))


def step3p5(t: str) -> bool:
    return _STEP35.search(t) is not None or _has(
        t, "reasoning_effort", "Reasoning: ", "<function=", "<parameter="
    )


#: (rule, parser name), first match wins
RULES: tuple[tuple[Callable[[str], bool], str], ...] = (
    (lambda t: _has(t, "<ifm|think>", "<ifm|tool_calls>", "<ifm|tool_call>"), "k2_horizon"),
    (lambda t: "<|inner_prefix|>" in t, "apertus2509"),
    (lambda t: "<|channel>" in t, "gemma4"),
    (lambda t: "<|channel|>" in t, "gpt-oss"),
    (lambda t: "<|tool_calls_section_begin|>" in t, "kimi_k2"),
    (lambda t: "<mm:think>" in t or "]<]minimax[>[" in t, "minimax-m3"),
    (lambda t: "<minimax:tool_call>" in t, "minimax-m2"),
    (lambda t: "default_thinking_sys" in t and enable_thinking_default_on(t), "interns1"),
    (lambda t: _has(t, "reasoning_effort", "[THINK]"), "mistral"),
    (lambda t: "<｜DSML｜ calls>" in t, "deepseekv41"),
    (lambda t: "<｜DSML｜tool_calls>" in t, "deepseekv4"),
    (lambda t: "<｜DSML｜function_calls>" in t, "deepseekv32"),
    (lambda t: _has(t, "<｜tool▁calls▁begin｜>", "<｜tool▁sep｜>"), "deepseekv31"),
    (lambda t: _has(t, "<|tool_call_start|>", "<|tool_call_end|>"), "lfm2"),
    (lambda t: glm_family(t) and "'<tool_call>' + tc.name" in t, "glm47"),
    (glm_family, "glm45"),
    # the vocabulary form (tokens "<function" and "<param") cannot be told from Qwen3-Coder's
    # "<function=" in template text, so only the template regex form is used
    (lambda t: all(p.search(t) for p in _MINICPM), "minicpm5"),
    (hunyuan, "hunyuan"),
    (poolside, "poolside_v1"),
    (step3p5, "step3p5"),
    (lambda t: "<steptml:invoke" in t or _has(t, "<｜tool_calls_begin｜>", "<｜tool_sep｜>"), "step3"),
    (lambda t: _has(t, "<role>SYSTEM</role>", "<role>ASSISTANT</role>", "<|role_end|>",
                    "<arg_key>", "<arg_value>"), "ling3"),
    (lambda t: _has(t, "<arg_key>", "<arg_value>"), "glm45"),
    (enable_thinking_default_off, "mimo"),
    (lambda t: _has(t, "<function=", "<parameter="), "qwen3_coder"),
    (enable_thinking_default_on, "qwen"),
    (thinking_default_off, "deepseekv3"),
    (forces_reasoning, "deepseekv3"),
)


def detect_tool_parser(chat_template: str) -> str | None:
    """The tool-call parser name for a chat template, or None when no rule matches."""
    if not chat_template:
        return None
    for rule, name in RULES:
        if rule(chat_template):
            return name
    return None
