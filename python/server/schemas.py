"""Request bodies of the OpenAI API as this server accepts them. Unknown fields are refused (a
typo'd parameter silently ignored is a surprise); fields OpenAI clients send that cannot change
what is generated here are accepted: `user`, `safety_identifier`, `store`, `metadata`,
`service_tier`, `prompt_cache_key` (the prefix cache needs no key),
`prediction` (a latency hint; the output is the same without it), `modalities: ["text"]` and
`stream_options.include_obfuscation` (nothing is padded). Beyond OpenAI's, as vLLM names them:
`top_k`, `min_p`, `repetition_penalty`, `ignore_eos`, `skip_special_tokens`,
`chat_template_kwargs`. `stop` takes up to 16 strings (OpenAI: 4); `logit_bias` up to 1024 tokens."""
from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

MAX_N = 8
MAX_STOP = 16
MAX_PROMPTS = 16  # prompts in one /v1/completions request
MAX_LOGIT_BIAS = 1024  # the engine's entries a sequence (logit_bias.zig)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FunctionCall(Strict):
    name: str
    arguments: str = "{}"


class ToolCallIn(Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


# Content parts the OpenAI API defines that are not text: accepted by the schema so that the route can
# say why it refuses them (this server runs text models; GLM-5.3-Flash's vision tower is not run).
MEDIA_PARTS = ("image_url", "input_image", "video_url", "input_audio", "file")


class ContentPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: Literal["text", "image_url", "input_image", "video_url", "input_audio", "file"]
    text: str | None = None


class Message(Strict):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: Union[str, list[ContentPart], None] = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None

    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content)

    def media_part(self) -> int | None:
        """The index of the first content part that is not text, if any."""
        if isinstance(self.content, list):
            for j, part in enumerate(self.content):
                if part.type != "text":
                    return j
        return None


class FunctionDef(Strict):
    name: str = Field(min_length=1, max_length=128)
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(Strict):
    type: Literal["function"]
    function: FunctionDef


class NamedToolChoice(Strict):
    type: Literal["function"]
    function: dict[str, str]


class StreamOptions(Strict):
    include_usage: bool = False
    include_obfuscation: bool | None = None


class JsonSchemaFormat(Strict):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    name: str = Field(min_length=1, max_length=64)
    description: str | None = None
    # `schema` would shadow pydantic's BaseModel.schema.
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None


class ResponseFormat(Strict):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None

    @model_validator(mode="after")
    def _schema_with_its_type(self):
        if (self.type == "json_schema") != (self.json_schema is not None):
            raise ValueError("json_schema is given with type 'json_schema', and only then")
        return self


class SamplingFields(Strict):
    model: str
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=0)
    min_p: float = Field(default=0.0, ge=0.0, le=1.0)
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0)
    repetition_penalty: float = Field(default=1.0, gt=0.0, le=10.0)
    seed: int | None = Field(default=None, ge=-(2 ** 63), lt=2 ** 64)
    n: int = Field(default=1, ge=1, le=MAX_N)
    stop: Union[str, list[str], None] = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    safety_identifier: str | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    # Token id (a decimal string, as JSON keys are) -> a value added to its logit before sampling.
    logit_bias: dict[str, float] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True

    @field_validator("stop")
    @classmethod
    def _stops(cls, value):
        stops = [value] if isinstance(value, str) else list(value or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop strings")
        if any(not s for s in stops):
            raise ValueError("stop strings must not be empty")
        return stops

    @field_validator("logit_bias")
    @classmethod
    def _logit_bias(cls, value):
        if value is None:
            return None
        if len(value) > MAX_LOGIT_BIAS:
            raise ValueError(f"at most {MAX_LOGIT_BIAS} tokens")
        for key, bias in value.items():
            if not key.isascii() or not key.isdigit():
                raise ValueError(f"keys are token ids (decimal strings), not {key!r}")
            if not -100 <= bias <= 100:  # NaN fails too
                raise ValueError(f"values are in [-100, 100], not {bias} (token {key})")
        return value

    def logit_bias_pairs(self) -> tuple[tuple[int, float], ...]:
        return tuple((int(key), float(bias)) for key, bias in (self.logit_bias or {}).items())


class ChatCompletionRequest(SamplingFields):
    messages: list[Message] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[Tool] | None = None
    tool_choice: Union[Literal["none", "auto", "required"], NamedToolChoice, None] = None
    parallel_tool_calls: bool | None = None
    response_format: ResponseFormat | None = None
    # The OpenAI API's efforts and GLM-5.3's "max"; handed to the chat template as is.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "max"] | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    modalities: list[Literal["text"]] | None = None
    prediction: dict[str, Any] | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_legacy_functions(cls, data):
        if isinstance(data, dict):
            for old, new in (("functions", "tools"), ("function_call", "tool_choice")):
                if old in data:
                    raise ValueError(f"'{old}' is the deprecated form of '{new}': send '{new}'")
        return data

    @field_validator("top_logprobs")
    @classmethod
    def _top_logprobs_need_logprobs(cls, value, info: ValidationInfo):
        if value is not None and not info.data.get("logprobs"):
            raise ValueError("top_logprobs needs logprobs: true")
        return value


class CompletionRequest(SamplingFields):
    # One prompt (text or token ids) or a list of them: each gets n choices, indexed prompt by prompt.
    prompt: Union[str, list[int], list[str], list[list[int]]]
    logprobs: int | None = Field(default=None, ge=0, le=20)
    echo: Literal[False] = False
    suffix: None = None

    @field_validator("prompt", mode="before")
    @classmethod
    def _prompt(cls, value):
        """One message for every wrong shape (the union's own lists four)."""
        shape = ("prompt must be a string, a list of token ids, or a list of up to "
                 f"{MAX_PROMPTS} prompts that are all strings or all token-id lists")
        prompts = value if isinstance(value, list) and value and not is_token(value[0]) else [value]
        if not 1 <= len(prompts) <= MAX_PROMPTS:
            raise ValueError(shape)
        kinds = set()
        for prompt in prompts:
            if isinstance(prompt, str):
                if not prompt:
                    raise ValueError("prompt must not be empty")
                kinds.add("text")
            elif isinstance(prompt, list) and all(is_token(t) for t in prompt):
                if not prompt or any(t < 0 for t in prompt):
                    raise ValueError("prompt token ids must be a non-empty list of non-negative integers")
                kinds.add("ids")
            else:
                raise ValueError(shape)
        if len(kinds) > 1:
            raise ValueError(shape)
        return value

    def prompts(self) -> list[Union[str, list[int]]]:
        value = self.prompt
        return value if isinstance(value, list) and not isinstance(value[0], int) else [value]


def is_token(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
