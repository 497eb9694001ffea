"""``engine parse``: raw model output on stdin -> the assistant message JSON on stdout.

    engine parse --reasoning-parser qwen3 --tool-call-parser qwen25 --tools tools.json < out.txt

``--stream`` feeds the text in chunks of ``--chunk-size`` characters through
:class:`engine.parsers.api.MessageStream` and prints the message assembled from the deltas, which
must equal the whole parse (tool-call ids aside). Light: no torch.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``engine parse`` options to ``parser``."""
    parser.add_argument("--reasoning-parser", default=None,
                        help="reasoning parser name (e.g. qwen3, deepseek-r1, gpt-oss, auto)")
    parser.add_argument("--tool-call-parser", default=None,
                        help="tool-call parser name (runs only when --tools is given)")
    parser.add_argument("--tools", default=None, metavar="FILE",
                        help="JSON file with the request's OpenAI tools array")
    parser.add_argument("--chat-template-kwargs", default=None, metavar="JSON",
                        help='JSON object, e.g. \'{"enable_thinking": false}\'')
    parser.add_argument("--reasoning-effort", default=None, help="the request's reasoning_effort")
    parser.add_argument("--chat-template", default=None, metavar="FILE",
                        help="chat template file (used by auto detection)")
    parser.add_argument("--no-separate-reasoning", dest="separate_reasoning",
                        action="store_false", help="keep the reasoning text in content")
    parser.add_argument("--prefill", default=None, metavar="TEXT",
                        help="the prefilled start of the assistant message that stdin continues "
                             "(a chat request's continue_final_message)")
    parser.add_argument("--stream", action="store_true",
                        help="parse through the streaming API in small chunks")
    parser.add_argument("--chunk-size", type=int, default=4, metavar="N",
                        help="characters per chunk with --stream (default 4)")


class _UsageError(Exception):
    pass


def _load_json(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _UsageError(f"{flag}: invalid JSON: {exc}") from None


def _tools(path: str | None) -> list[dict[str, Any]] | None:
    if path is None:
        return None
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
    except OSError as exc:
        raise _UsageError(f"--tools: cannot read {path}: {exc.strerror}") from None
    data = _load_json("--tools", raw)
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list) or not all(isinstance(t, dict) for t in data):
        raise _UsageError("--tools: expected a JSON array of tools")
    return [t if "function" in t else {"type": "function", "function": t} for t in data]


def _kwargs(args: argparse.Namespace) -> dict[str, Any]:
    ctk = None
    if args.chat_template_kwargs is not None:
        ctk = _load_json("--chat-template-kwargs", args.chat_template_kwargs)
        if not isinstance(ctk, dict):
            raise _UsageError("--chat-template-kwargs: expected a JSON object")
    template = None
    if args.chat_template is not None:
        try:
            with open(args.chat_template, encoding="utf-8") as f:
                template = f.read()
        except OSError as exc:
            raise _UsageError(f"--chat-template: cannot read {args.chat_template}: "
                              f"{exc.strerror}") from None
    if args.chunk_size < 1:
        raise _UsageError("--chunk-size: must be at least 1")
    return {
        "reasoning_parser": args.reasoning_parser, "tool_parser": args.tool_call_parser,
        "tools": _tools(args.tools), "chat_template_kwargs": ctk,
        "reasoning_effort": args.reasoning_effort, "chat_template": template,
        "separate_reasoning": args.separate_reasoning, "prefill": args.prefill,
    }


def run(args: argparse.Namespace) -> int:
    """Parse stdin and print the message; 2 on a usage or plugin error."""
    from engine.parsers.api import MessageStream, assemble, parse_message
    from engine.errors import PluginError

    try:
        kwargs = _kwargs(args)
        text = sys.stdin.read()
        if args.stream:
            stream = MessageStream(**kwargs)
            n = args.chunk_size
            deltas = [stream.feed(text[i:i + n]) for i in range(0, len(text), n)]
            deltas.append(stream.finish())
            message = assemble(deltas)
        else:
            message = parse_message(text, **kwargs)
    except (_UsageError, PluginError) as exc:
        print(f"engine parse: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(message, ensure_ascii=False, indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="engine parse", description=__doc__.splitlines()[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
