"""Request bodies of the HTTP API (pydantic), and their mapping to :class:`SamplingParams`.

:func:`parse_body` turns the bytes of a body into one of the request models, or a
:class:`RequestError` (HTTP 400) that says what is wrong and names the field. Unknown fields are
ignored (clients send vendor extensions); a field this server cannot honour (``best_of``
above 1) is refused rather than ignored. :func:`constraint` reads a request's one
structured-output constraint (``response_format``, or SGLang's ``json_schema``/``regex``/
``ebnf``). Range
checks live in :meth:`SamplingParams.validate`, whose field names are mapped back to the API's
names here (``max_new_tokens`` -> ``max_tokens`` or ``max_completion_tokens``).
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal, Mapping, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError
from pydantic_core import PydanticCustomError

from engine.api.grammar import GrammarSpec
from engine.runtime.frontend import RequestError
from engine.runtime.sampling import InvalidParam, SamplingParams

TokenIds = list[int]
MAX_JSON_DEPTH = 64  #: deepest nesting of arrays and objects in a request body


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


def _unsupported(accepted: Any, what: str = "") -> AfterValidator:
    """A field this server cannot honour: null and the ``accepted`` no-op value pass, any other
    value is refused (rather than silently ignored); ``what`` names the missing feature."""
    def check(value: Any) -> Any:
        if value is not None and value != accepted:
            raise PydanticCustomError("unsupported", f"{what or 'this field'} is not supported "
                                      f"by this server (only {json.dumps(accepted)} is "
                                      "accepted)")
        return value
    return AfterValidator(check)


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


class JsonSchemaFormat(_Body):
    """``response_format.json_schema`` (OpenAI); the schema is always enforced (``strict``
    changes nothing)."""

    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    strict: bool | None = None


class StructuralTag(_Body):
    """One structure of a ``structural_tag`` response format (SGLang's legacy shape): its
    ``begin`` (which starts with one of the triggers), a JSON value of ``schema`` (any JSON
    when absent), its ``end``."""

    begin: str
    schema_: dict[str, Any] | None = Field(None, alias="schema")
    end: str


class ResponseFormat(_Body):
    type: Literal["text", "json_object", "json_schema", "structural_tag"]
    json_schema: JsonSchemaFormat | None = None
    #: ``structural_tag``: free text in which each trigger starts one of the structures
    structures: list[StructuralTag] | None = None
    triggers: list[str] | None = None


class _SamplingFields(_Body):
    """Fields shared by the two OpenAI endpoints (extensions beyond OpenAI at the end)."""

    model: str | None = None
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    user: str | None = None
    # extensions
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    min_tokens: int | None = None
    ignore_eos: bool | None = None
    stop_token_ids: list[int] | None = None
    skip_special_tokens: bool | None = None
    rid: str | None = None
    priority: int | None = None  #: scheduling priority (higher first; see --schedule-policy)
    routing_key: str | None = None  #: requests of one key are admitted together (routing-key)
    # structured output: at most one of these (see constraint())
    response_format: ResponseFormat | None = None
    json_schema: str | None = None
    regex: str | None = None
    ebnf: str | None = None
    # a named custom logit processor (--enable-custom-logit-processor) and its parameters
    custom_logit_processor: Any = None
    custom_params: Any = None
    #: token id (as a string, as JSON objects carry it) -> bias in [-100, 100]
    logit_bias: dict[str, Any] | None = None

    def sampling_dict(self) -> dict[str, Any]:
        out = {
            "max_new_tokens": self.max_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "n": self.n, "stop": self.stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty, "seed": self.seed,
            "top_k": self.top_k, "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty, "min_new_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": self.skip_special_tokens, "logit_bias": self.logit_bias,
        }
        return {k: v for k, v in out.items() if v is not None or k == "max_new_tokens"}


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: Annotated[int | None, _unsupported(1)] = None


class EmbeddingRequest(_Body):
    """OpenAI ``/v1/embeddings``: ``input`` is a text, texts, token ids or lists of them."""

    input: str | list[str] | TokenIds | list[TokenIds]
    model: str | None = None
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = None
    user: str | None = None
    rid: str | None = None
    priority: int | None = None


class ChatMessage(_Body):
    model_config = ConfigDict(extra="allow")
    role: Literal["system", "user", "assistant", "tool", "developer", "function"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None
    tool_calls: list[dict[str, Any]] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None


class ChatCompletionRequest(_SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool = True
    chat_template_kwargs: dict[str, Any] | None = None
    reasoning_effort: str | None = None
    separate_reasoning: bool = True
    continue_final_message: bool = False
    add_generation_prompt: bool = True


class GenerateRequest(_Body):
    """SGLang-style native request: ``text`` or ``input_ids`` (one or a batch)."""

    text: str | list[str] | None = None
    input_ids: TokenIds | list[TokenIds] | None = None
    sampling_params: dict[str, Any] | list[dict[str, Any]] | None = None
    stream: bool = False
    rid: str | None = None
    priority: int | None = None
    routing_key: str | None = None
    return_logprob: bool = False
    top_logprobs_num: int = 0
    #: with ``return_logprob``: also the prompt tokens' log-probabilities from this position
    logprob_start_len: int = -1
    #: with ``return_logprob``: these tokens' log-probabilities at every scored position (one
    #: list for all inputs, or one per input)
    token_ids_logprob: list[int] | list[list[int]] | None = None
    #: the logprob entries' third element: the token's text (else null)
    return_text_in_logprobs: bool = False
    custom_logit_processor: Any = None  #: one, or one per input


class ScoreRequest(_Body):
    """``/v1/score`` (SGLang's decoder-only scoring): how likely each label token is to come
    next after ``query`` + each item (``item`` + ``query`` with ``item_first``)."""

    query: str | TokenIds
    items: str | list[str] | list[TokenIds]
    label_token_ids: TokenIds = Field(min_length=1)
    apply_softmax: bool = False
    item_first: bool = False
    model: str | None = None
    rid: str | None = None
    priority: int | None = None


class TokenizeRequest(_Body):
    """``/tokenize`` (SGLang's and vLLM's): one text or a list of texts."""

    prompt: str | list[str]
    model: str | None = None
    add_special_tokens: bool = True


class DetokenizeRequest(_Body):
    """``/detokenize``: one list of token ids or a list of them."""

    tokens: TokenIds | list[TokenIds]
    model: str | None = None
    skip_special_tokens: bool = True


#: SGLang's constraint fields, on the OpenAI bodies and in ``/generate``'s sampling_params
CONSTRAINT_FIELDS = ("json_schema", "regex", "ebnf")
#: ``/generate``'s sampling_params also take ``structural_tag`` (its JSON text, as SGLang)
GENERATE_CONSTRAINT_FIELDS = (*CONSTRAINT_FIELDS, "structural_tag")


def structural_tag_spec(structures: Any, triggers: Any, param: str) -> GrammarSpec:
    """The ``structural_tag`` spec of SGLang's ``structures`` and ``triggers``: at least one of
    each, and every structure's ``begin`` starting with a trigger (else a 400 naming
    ``param``)."""
    if not isinstance(triggers, list) or not triggers or \
            not all(isinstance(t, str) and t for t in triggers):
        raise RequestError("a structural_tag needs triggers: a non-empty list of non-empty "
                           "strings", param=param)
    if not isinstance(structures, list) or not structures:
        raise RequestError("a structural_tag needs structures: a non-empty list of "
                           "{begin, schema, end}", param=param)
    items = []
    for i, st in enumerate(structures):
        try:
            item = st if isinstance(st, StructuralTag) else StructuralTag.model_validate(st)
        except ValidationError:
            raise RequestError(f"structures[{i}] must be {{'begin': str, 'schema': object, "
                               "'end': str}", param=param) from None
        if not any(item.begin.startswith(t) for t in triggers):
            raise RequestError(f"structures[{i}].begin {item.begin!r} does not start with any "
                               "of the triggers", param=param)
        items.append({"begin": item.begin, "schema": item.schema_, "end": item.end})
    return GrammarSpec("structural_tag", json.dumps({"structures": items,
                                                     "triggers": triggers}))


def constraint(fields: Mapping[str, Any],
               response_format: ResponseFormat | None = None) -> tuple[GrammarSpec, str] | None:
    """The request's constraint and the field that gave it (``param`` of its errors), or None.

    ``fields`` holds SGLang's ``json_schema`` (a JSON text), ``regex`` and ``ebnf`` (and, from
    ``/generate``, ``structural_tag``: a JSON text); an OpenAI ``response_format`` of
    ``json_object``, ``json_schema`` or ``structural_tag`` is one too (``text`` is none).
    More than one is a :class:`RequestError`.
    """
    found: list[tuple[GrammarSpec, str]] = []
    if response_format is not None and response_format.type == "json_object":
        found.append((GrammarSpec("json_object"), "response_format"))
    elif response_format is not None and response_format.type == "json_schema":
        fmt = response_format.json_schema
        if fmt is None or fmt.schema_ is None:
            raise RequestError("response_format of type json_schema needs "
                               "json_schema.schema (a JSON schema object)",
                               param="response_format")
        found.append((GrammarSpec("json_schema", json.dumps(fmt.schema_)), "response_format"))
    elif response_format is not None and response_format.type == "structural_tag":
        found.append((structural_tag_spec(response_format.structures,
                                          response_format.triggers, "response_format"),
                      "response_format"))
    for name in GENERATE_CONSTRAINT_FIELDS:
        value = fields.get(name)
        if value is None:
            continue
        if not isinstance(value, str):
            raise RequestError(f"{name} must be a string", param=name)
        if name == "structural_tag":
            try:
                tag = json.loads(value)
            except ValueError:
                raise RequestError("structural_tag must be the JSON text of {structures, "
                                   "triggers}", param=name) from None
            if not isinstance(tag, dict):
                raise RequestError("structural_tag must be the JSON text of {structures, "
                                   "triggers}", param=name)
            found.append((structural_tag_spec(tag.get("structures"), tag.get("triggers"),
                                              name), name))
            continue
        found.append((GrammarSpec(name, value), name))
    if len(found) > 1:
        raise RequestError("a request takes at most one constraint; this one has "
                           + ", ".join(param for _, param in found), param=found[1][1])
    return found[0] if found else None


API_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
Body = TypeVar("Body", bound=BaseModel)


def to_sampling_params(data: dict[str, Any], *, names: Mapping[str, str] = API_NAMES,
                       defaults: Mapping[str, Any] | None = None) -> SamplingParams:
    """Build validated params; an :class:`InvalidParam` names the field as the request does
    (``names``: sampling-param name -> request field, e.g. ``max_new_tokens`` -> ``max_tokens``;
    empty for the native API, which uses the sampling names). ``defaults`` (the server's
    sampling defaults) fill what ``data`` leaves unset (missing or null)."""
    if defaults:
        data = {**defaults, **{k: v for k, v in data.items() if v is not None or k not in defaults}}
    try:
        return SamplingParams.from_dict(data)
    except InvalidParam as exc:
        if exc.param in names:
            name = names[exc.param]
            raise InvalidParam(name, str(exc).replace(exc.param, name)) from None
        raise


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """The request body ``raw`` as a ``model``, else a :class:`RequestError` (400) saying what is
    wrong: an empty body, bytes that are not UTF-8, text that is not JSON, nesting deeper than
    :data:`MAX_JSON_DEPTH`, a value that is not an object, a string that cannot be encoded as
    UTF-8 (a lone surrogate such as ``"\\ud800"``), a missing field or one of the wrong type or
    value. ``param`` is the top-level field at fault, when there is one."""
    if not raw.strip():
        raise RequestError("the request body is empty; expected a JSON object",
                           code="invalid_json")
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise RequestError(f"the request body is not valid UTF-8 (byte 0x{raw[exc.start]:02x} "
                           f"at offset {exc.start})", code="invalid_json") from None
    except json.JSONDecodeError as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}",
                           code="invalid_json") from None
    except RecursionError:
        raise _too_deep() from None
    if not isinstance(data, dict):
        raise RequestError("the request body must be a JSON object", code="invalid_json")
    _check_json(data)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise _invalid(exc) from None


def _too_deep() -> RequestError:
    return RequestError(f"the request body nests arrays and objects deeper than "
                        f"{MAX_JSON_DEPTH} levels", code="invalid_json")


def _check_json(data: dict[str, Any]) -> None:
    """Refuse nesting deeper than :data:`MAX_JSON_DEPTH` and strings (keys too) that are not
    encodable as UTF-8; iterative, so any depth that parsed is safe to walk."""
    stack: list[tuple[dict[str, Any] | list[Any], tuple[str | int, ...]]] = [(data, ())]
    while stack:
        node, path = stack.pop()
        if len(path) >= MAX_JSON_DEPTH:
            raise _too_deep()
        for key, value in node.items() if isinstance(node, dict) else enumerate(node):
            if isinstance(key, str):
                _check_text(key, path, key=True)
            if isinstance(value, str):
                _check_text(value, (*path, key))
            elif isinstance(value, (dict, list)):
                stack.append((value, (*path, key)))


def _check_text(text: str, path: tuple[str | int, ...], *, key: bool = False) -> None:
    if text.isascii():
        return
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        where = _where(path)
        what = f"a key in {where or 'the body'}" if key else where
        raise RequestError(f"{what} is not valid text: it contains the lone surrogate "
                           f"\\u{ord(text[exc.start]):04x} (strings must be encodable as "
                           "UTF-8)", param=str(path[0]) if path else None,
                           code="invalid_value") from None


def _where(path: tuple[str | int, ...]) -> str:
    """``('messages', 0, 'content')`` -> ``'messages[0].content'``."""
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in path).lstrip(".")


def _invalid(exc: ValidationError) -> RequestError:
    """The first error of a model validation, as a message naming the field."""
    err = exc.errors()[0]
    loc = _where(err["loc"])
    top = str(err["loc"][0]) if err["loc"] else None
    if err["type"] == "missing":
        msg = f"missing required field '{loc}'"
    elif err["type"] in ("model_type", "model_attributes_type", "dict_type"):
        msg = f"{loc}: expected a JSON object"
    else:
        msg = f"{loc}: {err['msg']}" if loc else err["msg"]
    return RequestError(msg, param=top, code="invalid_value")
