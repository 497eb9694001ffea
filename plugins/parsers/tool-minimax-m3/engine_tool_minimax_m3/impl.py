"""MiniMax-M3 tool calls: namespaced tags, one tag per parameter, nested objects and arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.api.parsers import (
    ParsedCall,
    Region,
    ToolContext,
    ValueTyping,
    XmlFormat,
    XmlToolParser,
    parse_attrs,
    property_schema,
    resolve_ref,
    schema_types,
)
from engine.api import hookimpl

NS = "]<]minimax[>["
_WS = " \t\r\n"
_NULLS = ("null", "Null", "NULL", "")
LEAF_TYPING = ValueTyping(
    typed="schema",
    untyped="raw",
    priority=("integer", "number", "boolean", "object", "array"),
    true_words=("true", "1", "yes", "on", "y"),
    false_words=("false", "0", "no", "off", "n"),
)


@dataclass
class Node:
    """One tag: its attributes, the text after its open tag, children, raw span."""

    tag: str
    attrs: dict[str, str]
    text: str = ""
    start: int = 0
    end: int = 0
    children: list[Node] = field(default_factory=list)


def tree(body: str, at: int) -> Node | None:
    """Parse ``NS<tag>text NS</tag>`` pieces into a tree (``None``: not well-formed)."""
    root = Node("", {})
    stack = [root]
    pieces = body.split(NS)
    if pieces[0].strip(_WS):
        return None
    pos = at + len(pieces[0])
    for piece in pieces[1:]:
        ns_at, pos = pos, pos + len(NS) + len(piece)
        p = piece.lstrip(_WS)
        gt = p.find(">")
        if not p.startswith("<") or gt < 0:
            return None
        tag, after = p[1:gt].strip(), p[gt + 1 :]
        if tag.startswith("/"):
            node = stack.pop()
            if node is root or node.tag != tag[1:].strip() or after.strip(_WS):
                return None
            node.end = pos - len(after)
            continue
        name, _, attrs = tag.partition(" ")
        node = Node(name, parse_attrs(attrs), after, ns_at)
        stack[-1].children.append(node)
        stack.append(node)
    return root if len(stack) == 1 else None


def convert(node: Node, prop: Any, root: dict[str, Any]) -> Any:
    """A node's value under its schema: children make an object (``item`` children or an
    array schema make a list; a repeated key makes a list); a leaf follows the schema."""
    schema = resolve_ref(prop, root)
    schema = schema if isinstance(schema, dict) else {}
    types = schema_types(prop, root)
    if not node.children:
        text = node.text
        if "null" in types and text.strip() in _NULLS:
            return None
        return LEAF_TYPING.convert(text, prop, root)
    if node.text.strip(_WS):
        raise ValueError("text beside child tags")
    if all(c.tag == "item" for c in node.children) or ("array" in types and "object" not in types):
        return [convert(c, schema.get("items"), root) for c in node.children]
    return members(node.children, schema, root)


def members(children: list[Node], schema: dict[str, Any], root: dict[str, Any]) -> dict[str, Any]:
    """Child tags as object members; a key that repeats collects its values in a list. A key
    declared under a top-level ``anyOf``/``oneOf``/``allOf`` of ``schema`` takes that type."""
    props = schema.get("properties") or {}
    out: dict[str, Any] = {}
    repeated: set[str] = set()
    for c in children:
        prop = props[c.tag] if c.tag in props else property_schema(schema, c.tag)
        value = convert(c, prop, root)
        if c.tag not in out:
            out[c.tag] = value
        elif c.tag in repeated:
            out[c.tag].append(value)
        else:
            out[c.tag] = [out[c.tag], value]
            repeated.add(c.tag)
    return out


@dataclass(frozen=True)
class MiniMaxM3Format(XmlFormat):
    """``NS<tool_call> NS<invoke name="f"> NS<key>value NS</key> ... NS</invoke> NS</tool_call>``
    where ``NS`` is ``]<]minimax[>[`` (whitespace allowed between it and ``<``). A ``NS`` not
    opening ``<tool_call>`` is content; a malformed block is content."""

    typing: ValueTyping = LEAF_TYPING

    @property
    def openers(self) -> tuple[str, ...]:
        return (NS,)

    def region(
        self, ctx: ToolContext, text: str, start: int, opener: str, final: bool, scan: int
    ) -> Region | None:
        p = start + len(NS)
        while p < len(text) and text[p] in _WS:
            p += 1
        head = text[p : p + len("<tool_call>")]
        if head != "<tool_call>":
            partial = "<tool_call>".startswith(head)
            return None if partial and not final else Region(None, None)
        body_at = p + len("<tool_call>")
        j = max(body_at, scan - len("</tool_call>") + 1)
        while True:
            j = text.find("</tool_call>", j)
            if j < 0:
                return Region(None, None) if final else None
            k = text[:j].rstrip(_WS)
            if k.endswith(NS) and len(k) - len(NS) >= body_at:
                break
            j += 1
        body = text[body_at : len(k) - len(NS)]
        return Region(j + len("</tool_call>"), self.parse(ctx, "", body, body_at))

    def parse(self, ctx: ToolContext, opener: str, body: str, at: int) -> list[ParsedCall] | None:
        root = tree(body, at)
        if root is None or not root.children:
            return None
        calls = []
        for inv in root.children:
            name = inv.attrs.get("name", "").strip()
            if inv.tag != "invoke" or not name or inv.text.strip(_WS):
                return None
            params = ctx.tool_schema(name)
            try:
                args = members(inv.children, resolve_ref(params, params) or {}, params)
            except ValueError:
                return None
            calls.append(ParsedCall(name, args, inv.start, inv.end))
        return calls


FORMAT = MiniMaxM3Format()


@hookimpl
def engine_create_tool_parser(options, chat_template):
    return lambda *, tools: XmlToolParser(tools=tools, fmt=FORMAT)
