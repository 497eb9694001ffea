"""The tokenizer wrapper (transformers' fast tokenizers, from an HF directory or from GGUF
metadata) and the incremental detokenizer used when streaming.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Sequence

from engine.errors import ConfigError
from engine.models.config import ModelConfig

log = logging.getLogger("engine.models")


class Tokenizer:
    """Text <-> ids and the chat template of one model.

    ``eos_token_ids`` unites the tokenizer's EOS and the model config's (generation) EOS ids.
    """

    def __init__(self, hf_tokenizer: Any, eos_token_ids: Sequence[int] = ()) -> None:
        self.hf = hf_tokenizer
        eos = list(eos_token_ids)
        if hf_tokenizer.eos_token_id is not None:
            eos.append(int(hf_tokenizer.eos_token_id))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))

    @classmethod
    def load(cls, model_config: ModelConfig, tokenizer_path: str | None = None, *,
             mode: str = "auto", chat_template: str | None = None) -> "Tokenizer":
        """From ``tokenizer_path``, else the model's directory or its GGUF metadata (offline).

        ``mode`` ``slow`` loads the Python tokenizer (not for GGUF metadata, which builds a
        fast one only). ``chat_template`` (:func:`read_chat_template`) replaces the model's.
        Raises :class:`ConfigError`.
        """
        from transformers import AutoTokenizer, PreTrainedTokenizerFast

        kwargs: dict[str, Any] = {"local_files_only": True}
        if tokenizer_path is not None and os.path.exists(tokenizer_path):
            tokenizer_path = os.path.abspath(tokenizer_path)  # a local path, never a hub id
        path = tokenizer_path or model_config.model_path
        if tokenizer_path is None and model_config.gguf_file:
            kwargs["gguf_file"] = model_config.gguf_file
        elif tokenizer_path and os.path.isfile(tokenizer_path) and tokenizer_path.endswith(".gguf"):
            path, kwargs["gguf_file"] = os.path.split(os.path.abspath(tokenizer_path))
        if mode == "slow":
            if "gguf_file" in kwargs:
                raise ConfigError("--tokenizer-mode slow: a GGUF's tokenizer is built as a fast "
                                  "tokenizer only; give --tokenizer-path an HF tokenizer "
                                  "directory")
            kwargs["use_fast"] = False
        # For a GGUF the fast-tokenizer class is built straight from the metadata; AutoTokenizer
        # would first parse the whole file again to pick the class (seconds for a big vocab).
        # The built tokenizer is cached (see gguf_tokenizer_cache), so a second start loads it
        # from its tokenizer.json.
        loader = PreTrainedTokenizerFast if "gguf_file" in kwargs else AutoTokenizer
        cached = (gguf_tokenizer_cache(os.path.join(path, kwargs["gguf_file"]))
                  if "gguf_file" in kwargs else None)
        try:
            hf = None
            if cached is not None and os.path.isfile(os.path.join(cached, "tokenizer.json")):
                try:
                    hf = PreTrainedTokenizerFast.from_pretrained(cached, local_files_only=True)
                except Exception as exc:  # noqa: BLE001 - a damaged entry: build it again
                    log.warning("ignoring the cached tokenizer %s (%s: %s)", cached,
                                type(exc).__name__, exc)
            if hf is None:
                hf = loader.from_pretrained(path, **kwargs)
                if cached is not None:
                    _save_cached(hf, cached)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise ConfigError(f"cannot load the tokenizer from {path}: "
                              f"{type(exc).__name__}: {first}") from None
        if chat_template is not None:
            hf.chat_template = read_chat_template(chat_template)
        return cls(hf, model_config.eos_token_ids)

    @property
    def vocab_size(self) -> int:
        return len(self.hf)

    @property
    def chat_template(self) -> str | None:
        """The chat template source (Jinja), or None when the model has none."""
        template = getattr(self.hf, "chat_template", None)
        if isinstance(template, dict):
            return template.get("default") or next(iter(template.values()), None)
        return template

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        return self.hf.convert_ids_to_tokens(list(ids))

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        """Render ``messages`` with the model's template: token ids, or text if not tokenize.

        Extra ``kwargs`` reach the template (``enable_thinking``...). Without a template:
        :class:`ConfigError`.
        """
        if not self.chat_template:
            raise ConfigError("this model has no chat template")
        text = self.hf.apply_chat_template(messages, tools=tools, tokenize=False,
                                           add_generation_prompt=add_generation_prompt,
                                           **kwargs)
        if not tokenize:
            return text
        return self.encode(text, add_special_tokens=False)


def gguf_tokenizer_cache(gguf_path: str) -> str | None:
    """Where the fast tokenizer built from ``gguf_path``'s metadata is cached: a folder under
    the engine cache directory (``tokenizers/``) named by a hash of the file's absolute path,
    size and modification time and of the transformers and tokenizers versions that built it.
    None when the file cannot be stat'ed."""
    import hashlib

    import tokenizers
    import transformers

    from engine.plugins import cache_dir

    try:
        st = os.stat(gguf_path)
    except OSError:
        return None
    key = "\0".join((os.path.abspath(gguf_path), str(st.st_size), str(st.st_mtime_ns),
                     transformers.__version__, tokenizers.__version__))
    digest = hashlib.sha256(key.encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), "tokenizers", f"{os.path.basename(gguf_path)}-{digest}")


def _save_cached(hf: Any, folder: str) -> None:
    """Save ``hf`` to ``folder`` atomically (written aside, then renamed); a cache that cannot
    be written is skipped with a log line."""
    import shutil
    import tempfile

    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
        try:
            hf.save_pretrained(tmp)
            if os.path.isdir(folder):  # a damaged entry
                shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as exc:
        if not os.path.isdir(folder):  # else another process saved it first
            log.info("the tokenizer is not cached (%s: %s)", type(exc).__name__, exc)


def read_chat_template(value: str) -> str:
    """``--chat-template``: the Jinja text of a file, or ``value`` itself when it is a template
    (has ``{{`` or ``{%``). Raises :class:`ConfigError` when it is neither or does not parse."""
    import jinja2

    if os.path.isfile(value):
        with open(value, encoding="utf-8") as fh:
            text = fh.read()
    elif "{{" in value or "{%" in value:
        text = value
    else:
        raise ConfigError(f"--chat-template {value}: no such file, and not a Jinja template "
                          "(no '{{' or '{%')")
    try:
        jinja2.Environment().parse(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ConfigError(f"--chat-template: not a valid Jinja template (line {exc.lineno}: "
                          f"{exc.message})") from None
    return text


class NoDetokenizer:
    """The detokenizer of a server without a tokenizer (``--skip-tokenizer-init``): requests
    carry token ids only, so there is never text."""

    def add(self, token_id: int) -> str:
        return ""

    def finish(self) -> str:
        return ""


class IncrementalDetokenizer:
    """Streams the text of one request's output ids, never emitting a broken UTF-8 character.

    ``add(id)`` returns the new complete text; ``finish()`` returns what is left (a trailing
    incomplete character, as the full decode renders it). The concatenation of all returns
    equals ``tokenizer.decode(all_ids)``. Decoding re-reads a small window of ids (from the last
    emitted boundary), so a token that completes a multi-byte character or changes spacing is
    rendered as the full decode renders it.
    """

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False,
                 prompt_ids: Sequence[int] = ()) -> None:
        self.tok, self.skip = tokenizer, skip_special_tokens
        # a few prompt ids as left context, so the first output token's leading space decodes
        # as it would after the prompt
        self.ids: list[int] = list(prompt_ids[-4:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)

    def _decode(self, start: int, end: int | None = None) -> str:
        return self.tok.decode(self.ids[start:end], skip_special_tokens=self.skip)

    def add(self, token_id: int) -> str:
        self.ids.append(int(token_id))
        prefix = self._decode(self.prefix_offset, self.read_offset)
        full = self._decode(self.prefix_offset)
        if full.endswith("\ufffd") or len(full) <= len(prefix):
            return ""  # an incomplete character: wait for the bytes that complete it
        self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
        return full[len(prefix):]

    def finish(self) -> str:
        prefix = self._decode(self.prefix_offset, self.read_offset)
        full = self._decode(self.prefix_offset)
        self.prefix_offset = self.read_offset = len(self.ids)
        return full[len(prefix):]
