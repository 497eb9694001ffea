"""The tokenizer wrapper and the incremental detokenizer used when streaming.

A tokenizer is built once by transformers (from an HF directory or from GGUF metadata) and saved
in the engine cache with the facts serving needs (``engine-tokenizer.json``: EOS, length, special
tokens, whether decoding cleans up spaces, the chat templates). Later starts read that folder
with the ``tokenizers`` library alone and render chat templates with :mod:`engine.models.
chat_template`: transformers is imported only when a plugin asks for ``tokenizer.hf``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Callable, Sequence

from engine.errors import ConfigError
from engine.models.config import ModelConfig

log = logging.getLogger("engine.models")

#: the facts a cached tokenizer folder carries beside transformers' own files
INFO_FILE = "engine-tokenizer.json"
INFO_VERSION = 1
#: files of a tokenizer directory whose change invalidates the cached tokenizer
_SOURCE_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                 "added_tokens.json", "chat_template.jinja", "chat_template.json",
                 "tokenizer.model", "vocab.json", "merges.txt", "vocab.txt")


class Tokenizer:
    """Text <-> ids and the chat template of one model.

    ``backend`` is the ``tokenizers`` (Rust) tokenizer that encodes and decodes; a tokenizer
    without one (``--tokenizer-mode slow``) goes through transformers. ``hf`` is the
    transformers tokenizer, loaded on first use. ``eos_token_ids`` unites the tokenizer's EOS and
    the model config's (generation) EOS ids.
    """

    def __init__(self, backend: Any, info: dict[str, Any], eos_token_ids: Sequence[int] = (),
                 *, hf: Any = None, hf_loader: Callable[[], Any] | None = None) -> None:
        self.backend = backend
        if backend is not None:
            backend.no_truncation()
            backend.no_padding()
        self.info = info
        self._hf, self._hf_loader = hf, hf_loader
        eos = list(eos_token_ids)
        if info.get("eos_token_id") is not None:
            eos.append(int(info["eos_token_id"]))
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(eos))

    @classmethod
    def from_hf(cls, hf: Any, eos_token_ids: Sequence[int] = ()) -> "Tokenizer":
        """Wrap a transformers tokenizer (its Rust backend when it is a fast one)."""
        return cls(getattr(hf, "backend_tokenizer", None), hf_info(hf), eos_token_ids, hf=hf)

    @classmethod
    def load(cls, model_config: ModelConfig, tokenizer_path: str | None = None, *,
             mode: str = "auto", chat_template: str | None = None) -> "Tokenizer":
        """From ``tokenizer_path``, else the model's directory or its GGUF metadata (offline).

        ``mode`` ``slow`` loads the Python tokenizer (not for GGUF metadata, which builds a
        fast one only). ``chat_template`` (:func:`read_chat_template`) replaces the model's.
        Raises :class:`ConfigError`.
        """
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
        template = read_chat_template(chat_template) if chat_template is not None else None
        source = os.path.join(path, kwargs["gguf_file"]) if "gguf_file" in kwargs else path
        cached = tokenizer_cache(source) if mode != "slow" else None
        tok = _load_cached(cached, model_config.eos_token_ids) if cached is not None else None
        if tok is None:
            tok = _build(path, kwargs, cached, model_config.eos_token_ids)
        if template is not None:
            tok.set_chat_template(template)
        return tok

    @property
    def hf(self) -> Any:
        """The transformers tokenizer (imports transformers on first use)."""
        if self._hf is None:
            self._hf = self._hf_loader()
            if self.info.get("chat_template_override") is not None:
                self._hf.chat_template = self.info["chat_template_override"]
        return self._hf

    def set_chat_template(self, template: str) -> None:
        """Replace the model's chat template(s) with ``template``."""
        self.info = {**self.info, "chat_template": template, "chat_template_override": template}
        if self._hf is not None:
            self._hf.chat_template = template

    @property
    def vocab_size(self) -> int:
        return int(self.info["length"])

    @property
    def chat_template(self) -> str | None:
        """The chat template source (Jinja), or None when the model has none."""
        template = self.info.get("chat_template")
        if isinstance(template, dict):
            return template.get("default") or next(iter(template.values()), None)
        return template

    def special_tokens(self) -> dict[str, int]:
        """The tokenizer's special tokens (bos, eos, unk, pad... and the additional ones) by
        text."""
        return dict(self.info.get("special_tokens") or {})

    def get_vocab(self) -> dict[str, int]:
        """Token text -> id, added tokens included."""
        if self.backend is None:
            return self.hf.get_vocab()
        return self.backend.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self.backend is None:
            return list(self.hf.encode(text, add_special_tokens=add_special_tokens))
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        if self.backend is None:
            return self.hf.decode(list(ids), skip_special_tokens=skip_special_tokens)
        text = self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)
        return clean_up_spaces(text) if self.info.get("clean_up_spaces") else text

    def convert_ids_to_tokens(self, ids: Sequence[int]) -> list[str]:
        if self.backend is None:
            return self.hf.convert_ids_to_tokens(list(ids))
        return [self.backend.id_to_token(int(i)) for i in ids]

    def apply_chat_template(self, messages: list[dict[str, Any]],
                            tools: list[dict[str, Any]] | None = None,
                            add_generation_prompt: bool = True, tokenize: bool = True,
                            **kwargs: Any) -> list[int] | str:
        """Render ``messages`` with the model's template: token ids, or text if not tokenize.

        Extra ``kwargs`` reach the template (``enable_thinking``...); ``documents`` and
        ``continue_final_message`` mean what they mean to transformers. Without a template:
        :class:`ConfigError`.
        """
        from engine.models import chat_template

        templates = self.info.get("chat_template")
        if not templates:
            raise ConfigError("this model has no chat template")
        documents = kwargs.pop("documents", None)
        continue_final = kwargs.pop("continue_final_message", False)
        text = chat_template.render(
            chat_template.pick(templates, tools), messages, tools=tools, documents=documents,
            add_generation_prompt=add_generation_prompt, continue_final_message=continue_final,
            variables={**(self.info.get("special_tokens_map") or {}), **kwargs})
        if not tokenize:
            return text
        return self.encode(text, add_special_tokens=False)


def clean_up_spaces(text: str) -> str:
    """The space clean-up of word-piece style decoding (`` .`` -> ``.``, `` n't`` -> ``n't``...),
    for tokenizers whose configuration asks for it."""
    for a, b in ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"),
                 (" n't", "n't"), (" 'm", "'m"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re")):
        text = text.replace(a, b)
    return text


def hf_info(hf: Any) -> dict[str, Any]:
    """What serving needs of a transformers tokenizer, as transformers itself computes it:
    EOS id, length, special tokens (by variable name and by text), whether decoding cleans up
    spaces, and the chat template(s)."""
    special: dict[str, int] = {}
    for text in getattr(hf, "all_special_tokens", ()) or ():
        tid = hf.convert_tokens_to_ids(text)
        if isinstance(tid, int) and tid >= 0:
            special[text] = tid
    cleanup = bool(getattr(hf, "clean_up_tokenization_spaces", False))
    backend = getattr(hf, "backend_tokenizer", None)
    if cleanup and backend is not None and type(backend.model).__name__ == "BPE":
        # transformers skips the clean-up for BPE models unless told to corrupt their output
        cleanup = bool(getattr(
            hf, "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",
            False))
    tokens_map = {k: v for k, v in dict(getattr(hf, "special_tokens_map", {}) or {}).items()}
    return {"version": INFO_VERSION, "eos_token_id": hf.eos_token_id, "length": len(hf),
            "special_tokens": special, "special_tokens_map": tokens_map,
            "clean_up_spaces": cleanup, "chat_template": getattr(hf, "chat_template", None)}


def _build(path: str, kwargs: dict[str, Any], cached: str | None,
           eos_token_ids: Sequence[int]) -> Tokenizer:
    """Build the tokenizer with transformers (and cache it when ``cached`` is given)."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    # For a GGUF the fast-tokenizer class is built straight from the metadata; AutoTokenizer
    # would first parse the whole file again to pick the class (seconds for a big vocab).
    loader = PreTrainedTokenizerFast if "gguf_file" in kwargs else AutoTokenizer
    try:
        hf = loader.from_pretrained(path, **kwargs)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ConfigError(f"cannot load the tokenizer from {path}: "
                          f"{type(exc).__name__}: {first}") from None
    tok = Tokenizer.from_hf(hf, eos_token_ids)
    if cached is not None and tok.backend is not None:
        _save_cached(hf, tok.info, cached)
    return tok


def _load_cached(folder: str, eos_token_ids: Sequence[int]) -> Tokenizer | None:
    """The tokenizer saved in ``folder``, read without transformers; None when there is none
    (or it is damaged: it is built again)."""
    info_path = os.path.join(folder, INFO_FILE)
    if not os.path.isfile(info_path):
        return None
    try:
        import tokenizers

        with open(info_path, encoding="utf-8") as fh:
            info = json.load(fh)
        if info.get("version") != INFO_VERSION:
            return None
        backend = tokenizers.Tokenizer.from_file(os.path.join(folder, "tokenizer.json"))
    except Exception as exc:  # noqa: BLE001 - a damaged entry: build it again
        log.warning("ignoring the cached tokenizer %s (%s: %s)", folder, type(exc).__name__, exc)
        return None

    def hf_loader() -> Any:
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)

    return Tokenizer(backend, info, eos_token_ids, hf_loader=hf_loader)


def tokenizer_cache(source: str) -> str | None:
    """Where the tokenizer of ``source`` (a GGUF file, or a tokenizer directory) is cached: a
    folder under the engine cache directory (``tokenizers/``) named by a hash of the source's
    absolute path, of its size and modification time (a directory's: those of its tokenizer
    files) and of the transformers and tokenizers versions. None when ``source`` cannot be
    stat'ed."""
    import hashlib
    from importlib.metadata import PackageNotFoundError, version

    from engine.plugins import cache_dir

    source = os.path.abspath(source)
    parts = [source]
    try:
        if os.path.isdir(source):
            for name in _SOURCE_FILES:
                f = os.path.join(source, name)
                if os.path.isfile(f):
                    st = os.stat(f)
                    parts += [name, str(st.st_size), str(st.st_mtime_ns)]
        else:
            st = os.stat(source)
            parts += [str(st.st_size), str(st.st_mtime_ns)]
        for dist in ("transformers", "tokenizers"):
            parts.append(version(dist))
    except (OSError, PackageNotFoundError):
        return None
    digest = hashlib.sha256("\0".join(parts).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), "tokenizers", f"{os.path.basename(source)}-{digest}")


def _save_cached(hf: Any, info: dict[str, Any], folder: str) -> None:
    """Save ``hf`` and ``info`` to ``folder`` atomically (written aside, then renamed); a cache
    that cannot be written is skipped with a log line."""
    import shutil
    import tempfile

    try:
        os.makedirs(os.path.dirname(folder), exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=".tmp-", dir=os.path.dirname(folder))
        try:
            hf.save_pretrained(tmp)
            if not os.path.isfile(os.path.join(tmp, "tokenizer.json")):
                shutil.rmtree(tmp, ignore_errors=True)
                return
            with open(os.path.join(tmp, INFO_FILE), "w", encoding="utf-8") as fh:
                json.dump(info, fh)
            if os.path.isdir(folder):  # a damaged entry
                shutil.rmtree(folder, ignore_errors=True)
            os.rename(tmp, folder)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except (OSError, TypeError, ValueError) as exc:
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
