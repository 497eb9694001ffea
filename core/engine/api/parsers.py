"""The parser families' interfaces and the shared machinery most parsers are built from.

Hooks: ``engine_create_reasoning_parser`` and ``engine_create_tool_parser`` return a *factory*
called once per response (see :mod:`engine.plugins.hookspecs`). A reasoning parser splits model
text into reasoning and content (:class:`ReasoningParser`: ``parse`` whole, ``feed``/``finish``
streamed); a tool-call parser extracts calls (:class:`ToolParser`). Streaming deltas
concatenate to the whole result. :mod:`engine.testing.reasoning` and :mod:`engine.testing.tools`
are the conformance suites.

Building blocks: :class:`TagReasoningParser` and :class:`MarkerStateParser` (``<think>``-style
splitters) behind a :class:`ParserFactory` with a :class:`ReasoningPolicy` (when reasoning is
on); :class:`StreamingToolParser` with :class:`CallState`/:class:`JsonCallStreamer` for
JSON-in-markers formats and the JSON family (:class:`JsonTagParser`, :class:`JsonListParser`,
:class:`SectionParser`...), :class:`XmlToolParser` with an :class:`XmlFormat` and a
:class:`ValueTyping` for XML-style formats.
"""

from engine.parsers.base import (ReasoningDelta, ReasoningParser, ToolCall, ToolCallDelta,
                                 ToolDelta, ToolParser, ToolResult)
from engine.parsers.json_tools import (JsonListParser, JsonSequenceParser, JsonTagParser,
                                       MistralParser, PythonicParser, SectionParser,
                                       parse_pythonic_calls, recover_pythonic_calls)
from engine.parsers.reasoning import (POLICIES, MarkerStateParser, ParserFactory,
                                      PassthroughReasoningParser, ReasoningPolicy,
                                      StreamingReasoningParser, TagReasoningParser,
                                      effective_policy, find_first, nonempty_requested,
                                      partial_tail, strip_leading, take_until, template_policy)
from engine.parsers.toolkit import (Block, CallState, JsonCallStreamer, JsonStreamer,
                                    PassThroughToolParser, StreamingToolParser, TaggedBlockParser,
                                    close_block_after, dump_arguments, finite, loads_json,
                                    loads_object, match_token,
                                    next_token, skip_ws)
from engine.parsers.xml_tools import (DSML_TYPING, JSON_TYPING, SCHEMA_TYPING, ArgPairFormat,
                                      FunctionFormat, InvokeFormat, ParsedCall, Region,
                                      ToolContext, ValueTyping, XmlFormat, XmlToolParser,
                                      earliest, parse_attrs, property_schema, resolve_ref,
                                      schema_types)

__all__ = [
    "DSML_TYPING", "JSON_TYPING", "POLICIES", "SCHEMA_TYPING", "ArgPairFormat", "Block",
    "CallState", "FunctionFormat", "InvokeFormat", "JsonCallStreamer", "JsonListParser",
    "JsonSequenceParser", "JsonStreamer", "JsonTagParser", "MarkerStateParser", "MistralParser",
    "ParsedCall", "ParserFactory", "PassThroughToolParser", "PassthroughReasoningParser",
    "PythonicParser", "ReasoningDelta", "ReasoningParser", "ReasoningPolicy", "Region",
    "SectionParser", "StreamingReasoningParser", "StreamingToolParser", "TagReasoningParser",
    "TaggedBlockParser", "ToolCall", "ToolCallDelta", "ToolContext", "ToolDelta", "ToolParser",
    "ToolResult", "ValueTyping", "XmlFormat", "XmlToolParser", "close_block_after",
    "dump_arguments", "earliest", "effective_policy", "find_first", "finite", "loads_json",
    "loads_object", "recover_pythonic_calls",
    "match_token", "next_token", "nonempty_requested", "parse_attrs", "parse_pythonic_calls",
    "partial_tail", "property_schema", "resolve_ref", "schema_types", "skip_ws",
    "strip_leading", "take_until", "template_policy",
]
