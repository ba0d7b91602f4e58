"""Typed request and response models the OpenAPI description is generated from.

The OpenAI routes use the ``openai`` package's own types (its request ``TypedDict``s, its
response models); only ``stream``, which the package splits over a streaming and a
non-streaming variant of each request, is added back here as one optional boolean. vLLM's
own routes (tokenize, detokenize, pooling, classify, score, rerank) have no OpenAI type: they
are modelled here after vLLM 0.32's protocol models (``vllm/entrypoints/serve/tokenize`` and
``vllm/entrypoints/pooling``), without importing vLLM, which the gateway does not install.

Nothing here validates a request: the gateway forwards bodies to vLLM untouched.
"""

from __future__ import annotations

import time
from typing import Annotated, Any, Literal, Required

from openai.types import (
    Completion,
    CompletionChoice,
    completion_create_params,
    embedding_create_params,
)
from openai.types.chat import (
    ChatCompletionContentPartImageParam,
    ChatCompletionContentPartTextParam,
    ChatCompletionFunctionToolParam,
    ChatCompletionMessageParam,
)
from openai.types.chat import (
    completion_create_params as chat_create_params,
)
from openai.types.responses import response_create_params
from pydantic import BaseModel, ConfigDict, Field
from typing_extensions import TypedDict

# -- OpenAI requests, with `stream` as one field ------------------------------------------


class ChatCompletionRequest(chat_create_params.CompletionCreateParamsBase, total=False):
    """``POST /v1/chat/completions``: OpenAI's chat request."""

    stream: bool | None


class CompletionRequest(completion_create_params.CompletionCreateParamsBase, total=False):
    """``POST /v1/completions``: OpenAI's (legacy) completions request."""

    stream: bool | None


class ResponseRequest(response_create_params.ResponseCreateParamsBase, total=False):
    """``POST /v1/responses``: OpenAI's Responses API request."""

    stream: bool | None


EmbeddingRequest = embedding_create_params.EmbeddingCreateParams


class CompletionChunkChoice(CompletionChoice):
    # No finish_reason until a choice's last chunk.
    finish_reason: Literal["stop", "length", "content_filter"] | None = None  # type: ignore[assignment]


class CompletionChunk(Completion):
    """One event of a completions stream: OpenAI's Completion, with the choices unfinished."""

    choices: list[CompletionChunkChoice]  # type: ignore[assignment]


# -- vLLM's own routes ----------------------------------------------------------------------


class _VllmModel(BaseModel):
    # vLLM's OpenAIBaseModel: unknown fields are allowed (and ignored).
    model_config = ConfigDict(extra="allow")


def _now() -> int:
    return int(time.time())


# vLLM fills these itself (default factories), so its models do not require them.
_Id = Annotated[str, Field(default_factory=str)]
_Created = Annotated[int, Field(default_factory=_now)]


class _Request(_VllmModel):
    model: str = Field(description="A model served by the gateway (GET /v1/models).")


_ChatMessages = Annotated[
    list[ChatCompletionMessageParam], Field(description="OpenAI chat messages.")
]


class _ChatTemplateOptions(BaseModel):
    add_generation_prompt: bool = False
    continue_final_message: bool = Field(
        False, description="Cannot be true together with add_generation_prompt."
    )
    add_special_tokens: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    media_io_kwargs: dict[str, dict[str, Any]] | None = None


# vLLM refuses `continue_final_message` and `add_generation_prompt` both true.
_NOT_BOTH_PROMPT_OPTIONS: dict[str, Any] = {
    "not": {
        "required": ["add_generation_prompt", "continue_final_message"],
        "properties": {
            "add_generation_prompt": {"const": True},
            "continue_final_message": {"const": True},
        },
    }
}


class TokenizeCompletionRequest(_Request):
    """``POST /tokenize`` with a prompt."""

    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Request, _ChatTemplateOptions):
    """``POST /tokenize`` with chat messages (the chat template applied)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_NOT_BOTH_PROMPT_OPTIONS)

    messages: _ChatMessages
    add_generation_prompt: bool = True
    return_token_strs: bool | None = False
    mm_processor_kwargs: dict[str, Any] | None = None
    tools: list[ChatCompletionFunctionToolParam] | None = None


TokenizeRequest = TokenizeCompletionRequest | TokenizeChatRequest


class TokenizeResponse(_VllmModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeRequest(_Request):
    """``POST /detokenize``."""

    tokens: list[Annotated[int, Field(ge=0, le=2**63 - 1)]]


class DetokenizeResponse(_VllmModel):
    prompt: str


class _PoolingBasics(_Request):
    user: str | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    padding: Literal["max_length", "do_not_pad"] | None = None
    truncation_side: Literal["left", "right"] | None = None
    request_id: str | None = Field(None, description="vLLM's id for the request.")
    priority: int = Field(0, ge=-(2**63), le=2**63 - 1)
    mm_processor_kwargs: dict[str, Any] | None = None
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)


_TokenIdsOrTexts = list[int] | list[list[int]] | str | list[str]


class _CompletionInput(BaseModel):
    input: _TokenIdsOrTexts
    add_special_tokens: bool = True


class _Encoding(BaseModel):
    encoding_format: Literal["float", "base64", "bytes", "bytes_only"] = "float"
    embed_dtype: Literal["float32", "float16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = "float32"
    endianness: Literal["native", "big", "little"] = "native"
    dimensions: int | None = None


PoolingTask = Literal["embed", "classify", "token_embed", "token_classify", "plugin"]


class PoolingCompletionRequest(_PoolingBasics, _CompletionInput, _Encoding):
    """``POST /pooling`` with a prompt (text, texts or token ids)."""

    use_activation: bool | None = None
    task: PoolingTask | None = None


class PoolingChatRequest(_PoolingBasics, _ChatTemplateOptions, _Encoding):
    """``POST /pooling`` with chat messages."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_NOT_BOTH_PROMPT_OPTIONS)

    messages: _ChatMessages
    use_activation: bool | None = None
    task: PoolingTask | None = None


PoolingRequest = PoolingCompletionRequest | PoolingChatRequest


class PoolingData(_VllmModel):
    index: int
    object: str = "pooling"
    data: list[list[float]] | list[float] | str


class UsageInfo(_VllmModel):
    prompt_tokens: int = 0
    total_tokens: int = 0
    completion_tokens: int | None = 0


class PoolingResponse(_VllmModel):
    id: _Id
    object: str = "list"
    created: _Created
    model: str
    data: list[PoolingData]
    usage: UsageInfo


class ClassificationCompletionRequest(_PoolingBasics, _CompletionInput):
    """``POST /classify`` with a prompt."""

    use_activation: bool | None = None


class ClassificationChatRequest(_PoolingBasics, _ChatTemplateOptions):
    """``POST /classify`` with chat messages."""

    model_config = ConfigDict(extra="allow", json_schema_extra=_NOT_BOTH_PROMPT_OPTIONS)

    messages: _ChatMessages
    use_activation: bool | None = None


ClassificationRequest = ClassificationCompletionRequest | ClassificationChatRequest


class ClassificationData(_VllmModel):
    index: int
    label: str | None
    probs: list[float]
    num_classes: int


class ClassificationResponse(_VllmModel):
    id: _Id
    object: str = "list"
    created: _Created
    model: str
    data: list[ClassificationData]
    usage: UsageInfo


class VideoURL(TypedDict, total=False):
    url: Required[str]


class ChatCompletionContentPartVideoParam(TypedDict, total=False):
    video_url: Required[VideoURL]
    type: Required[Literal["video_url"]]


class ChatCompletionContentPartImageEmbedsParam(TypedDict, total=False):
    image_embeds: str | dict[str, Any] | None
    type: Required[Literal["image_embeds"]]
    uuid: str | None


ScoreContentPart = (
    ChatCompletionContentPartImageParam
    | ChatCompletionContentPartImageEmbedsParam
    | ChatCompletionContentPartTextParam
    | ChatCompletionContentPartVideoParam
)


class ScoreMultiModalParam(TypedDict, total=False):
    content: Required[list[ScoreContentPart]]


ScoreInput = str | ScoreMultiModalParam
_ScoreInputs = ScoreInput | list[ScoreInput]


class _Scoring(_PoolingBasics):
    use_activation: bool | None = None
    max_tokens_per_query: int = 0
    max_tokens_per_doc: int = 0
    instruction: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class ScoreQueriesDocumentsRequest(_Scoring):
    """``POST /score``: queries against documents."""

    queries: _ScoreInputs
    documents: _ScoreInputs


class ScoreQueriesItemsRequest(_Scoring):
    """``POST /score``: queries against items."""

    queries: _ScoreInputs
    items: _ScoreInputs


class ScoreDataRequest(_Scoring):
    """``POST /score``: data_1 against data_2."""

    data_1: _ScoreInputs
    data_2: _ScoreInputs


class ScoreTextRequest(_Scoring):
    """``POST /score``: text_1 against text_2."""

    text_1: _ScoreInputs
    text_2: _ScoreInputs


ScoreRequest = (
    ScoreQueriesDocumentsRequest | ScoreQueriesItemsRequest | ScoreDataRequest | ScoreTextRequest
)


class ScoreData(_VllmModel):
    index: int
    object: str = "score"
    score: float


class ScoreResponse(_VllmModel):
    id: _Id
    object: str = "list"
    created: _Created
    model: str
    data: list[ScoreData]
    usage: UsageInfo


class RerankRequest(_Scoring):
    """``POST /rerank`` (Jina and Cohere style)."""

    query: ScoreInput
    documents: _ScoreInputs
    top_n: int = Field(0, ge=0)


class RerankDocument(BaseModel):
    text: str | None = None
    multi_modal: list[ScoreContentPart] | None = None


class RerankResult(BaseModel):
    index: int
    document: RerankDocument
    relevance_score: float


class RerankUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class RerankResponse(_VllmModel):
    id: str
    model: str
    usage: RerankUsage
    results: list[RerankResult]
