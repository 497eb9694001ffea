"""Chat templates rendered with Jinja, in the environment Hugging Face chat templates are written
for, without importing transformers (a second of start-up and ~50 MiB for a CPU server).

The contract these templates are written against (the Hugging Face chat-templating docs and
transformers' ``apply_chat_template``) and that :func:`render` keeps:

* an immutable sandbox with ``trim_blocks`` and ``lstrip_blocks``, the ``loopcontrols``
  extension and a ``{% generation %}...{% endgeneration %}`` block (rendered as its body);
* ``tojson`` that does not escape HTML and takes ``indent``, ``separators``, ``sort_keys`` and
  ``ensure_ascii``; globals ``raise_exception(message)``, ``strftime_now(format)``, ``dict`` and
  ``namespace`` (which refuses underscore-prefixed names);
* the variables ``messages``, ``tools``, ``documents``, ``add_generation_prompt``, the special
  tokens by name (``bos_token``, ``eos_token``...) and the caller's extra variables (which win
  over a special token of the same name);
* each message's keys whose value is ``None`` are dropped; a message's reasoning given as
  ``reasoning_content``, ``reasoning`` or ``thinking`` is visible under the first and the last;
* ``continue_final_message``: the rendering ends inside the final message, so the model
  continues it.

``tests/runtime/test_tokenizer_fast.py`` checks the text equals transformers' own rendering on
the templates the tests carry.
"""

from __future__ import annotations

import datetime
import functools
import json
from typing import Any

#: names a message's reasoning is given under; the first is the one templates read
REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def pick(templates: str | dict[str, str] | None, tools: Any = None) -> str:
    """The template to render: the only one, else ``tool_use`` when there are tools, else
    ``default``. Raises ValueError when there is none."""
    if isinstance(templates, dict):
        if tools is not None and "tool_use" in templates:
            return templates["tool_use"]
        if "default" in templates:
            return templates["default"]
        raise ValueError("this model has several chat templates and none is the default: "
                         f"{sorted(templates)}")
    if not templates:
        raise ValueError("this model has no chat template")
    return templates


@functools.lru_cache(maxsize=16)
def compile_template(source: str) -> Any:
    """The compiled template of ``source`` (cached by its text)."""
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    import jinja2.utils
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %}body{% endgeneration %}``: the body (the block only marks what the
        assistant wrote, for training masks)."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body
                                          ).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    class SafeNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):  # noqa: N805 - the signature of jinja2's Namespace
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                SafeNamespace._check(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            SafeNamespace._check(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"a chat template may not set the namespace attribute {name!r}")

    class DictMaker:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

        def fromkeys(self, *args, **kwargs):
            return dict.fromkeys(*args, **kwargs)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now,
                       dict=DictMaker(), namespace=SafeNamespace)
    return env.from_string(source)


def _plain(value: Any) -> Any:
    """A copy of ``value`` made of plain JSON types (a template never sees other objects)."""
    if value is None or type(value) in (str, int, float, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, bool):
        return bool(value)
    if isinstance(value, int):
        return int.__int__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, dict):
        return {_plain(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    if callable(getattr(value, "model_dump", None)):
        return _plain(value.model_dump())
    return f"<{type(value).__name__}>"


def _messages(messages: list[Any]) -> list[dict[str, Any]]:
    out = []
    for message in messages:
        if callable(getattr(message, "model_dump", None)):
            message = message.model_dump()
        if not isinstance(message, dict):
            raise TypeError(f"a chat message is an object, got {message!r}")
        message = {k: _plain(v) for k, v in message.items() if v is not None}
        reasoning = next((message[k] for k in REASONING_FIELDS if message.get(k) is not None),
                         None)
        if reasoning is not None:
            message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
        out.append(message)
    return out


def render(source: str, messages: list[Any], *, tools: list[dict] | None = None,
           documents: list[dict] | None = None, add_generation_prompt: bool = False,
           continue_final_message: bool | str = False,
           variables: dict[str, Any] | None = None) -> str:
    """The text of ``messages`` rendered by the template ``source``; ``variables`` are the
    special tokens by name and the caller's extra template variables. Raises ValueError (bad
    arguments) or a ``jinja2`` error (the template's own)."""
    if not messages:
        raise ValueError("the conversation is empty")
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt exclude each other")
    chat = _messages(messages)
    final = None
    if continue_final_message:
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        final = chat[-1].get(field)
        if final is None:
            raise ValueError(f"continue_final_message: the final message has no {field!r}")
        fields = [field]
        if field in REASONING_FIELDS:
            fields = [f for f in REASONING_FIELDS if chat[-1].get(f) == final]
        if not any(f in source for f in fields):
            raise ValueError(f"continue_final_message: the chat template never reads {field!r}")
        if isinstance(final, (list, tuple)):
            for block in reversed(final):
                if isinstance(block, dict) and "text" in block:
                    final = block["text"]
                    block["text"] = block["text"] + _CONTINUE_TAG
                    break
            else:
                raise ValueError("continue_final_message: the final message has no text")
        else:
            for f in fields:
                chat[-1][f] = chat[-1][f] + _CONTINUE_TAG
    for i, doc in enumerate(documents or ()):
        if not isinstance(doc, dict):
            raise TypeError(f"documents[{i}] is not an object")
    for i, tool in enumerate(tools or ()):
        if not isinstance(tool, dict):
            raise ValueError(f"tools[{i}] is not a JSON schema object")
    text = compile_template(source).render(
        messages=chat, tools=_plain(tools), documents=_plain(documents),
        add_generation_prompt=add_generation_prompt, **_plain(dict(variables or {})))
    if final is not None:
        tag = _CONTINUE_TAG.strip()
        if final.strip() not in text or tag not in text:
            raise ValueError("continue_final_message: the chat template dropped part of the "
                             "final message")
        at = text.rindex(tag)
        text = text[:at] if text[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG \
            else text[:at].rstrip()
    return text
