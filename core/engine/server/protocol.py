"""Request bodies of the HTTP API (pydantic), and their mapping to :class:`SamplingParams`.

Unknown fields are ignored (clients send vendor extensions); wrongly typed fields are rejected
with HTTP 400 naming the field. Range checks live in :meth:`SamplingParams.validate`, whose
field names are mapped back to the API's names here (``max_new_tokens`` -> ``max_tokens``).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from engine.runtime.sampling import InvalidParam, SamplingParams

TokenIds = list[int]


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool = False
    continuous_usage_stats: bool = False


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

    def sampling_dict(self) -> dict[str, Any]:
        out = {
            "max_new_tokens": self.max_tokens, "temperature": self.temperature,
            "top_p": self.top_p, "n": self.n, "stop": self.stop,
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty, "seed": self.seed,
            "top_k": self.top_k, "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty, "min_new_tokens": self.min_tokens,
            "ignore_eos": self.ignore_eos, "stop_token_ids": self.stop_token_ids,
            "skip_special_tokens": self.skip_special_tokens,
        }
        return {k: v for k, v in out.items() if v is not None or k == "max_new_tokens"}


class CompletionRequest(_SamplingFields):
    prompt: str | list[str] | TokenIds | list[TokenIds]
    max_tokens: int | None = 16  # OpenAI's default for completions
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None


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
    response_format: dict[str, Any] | None = None
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
    return_logprob: bool = False
    top_logprobs_num: int = 0


_API_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}


def to_sampling_params(data: dict[str, Any], *, api_names: bool = True) -> SamplingParams:
    """Build validated params; an :class:`InvalidParam` names the API field (``max_tokens``)."""
    try:
        return SamplingParams.from_dict(data)
    except InvalidParam as exc:
        if api_names and exc.param in _API_NAMES:
            name = _API_NAMES[exc.param]
            raise InvalidParam(name, str(exc).replace(exc.param, name)) from None
        raise
