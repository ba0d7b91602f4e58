"""Tool calling per model family: which vLLM tool-call parser reads a family's tool calls,
and which chat template renders tools for it.

Both tiers serve the same model, so both get the same pair (same capabilities): the family
is read from the served model name (what clients ask for), then the checkpoint's path.

| family (name contains)   | parser        | chat template                                  |
|--------------------------|---------------|------------------------------------------------|
| SmolLM2                  | `hermes`      | tiergate's `chatml_tools.jinja` (its own has no |
|                          |               | tools; this one writes Hermes `<tool_call>`)    |
| Qwen2.5, Qwen3, Hermes   | `hermes`      | the model's own                                 |
| Llama 3.1 / 3.2 / 3.3    | `llama3_json` | the model's own                                 |
| Mistral                  | `mistral`     | the model's own                                 |
| Granite                  | `granite`     | the model's own                                 |

An unknown family gets no parser: ``tool_choice: "auto"`` is then answered as text by vLLM,
while a named tool choice and ``"required"`` still work (vLLM constrains the output to the
tool's JSON schema). Set ``tool_call_parser`` and ``chat_template`` in the tier profiles for
a model not listed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True, slots=True)
class ToolSupport:
    parser: str | None
    chat_template: str | None = None


_FAMILIES: tuple[tuple[re.Pattern[str], ToolSupport], ...] = (
    (re.compile(r"smollm2", re.I), ToolSupport("hermes", str(TEMPLATES / "chatml_tools.jinja"))),
    (re.compile(r"qwen2\.5|qwen3|hermes", re.I), ToolSupport("hermes")),
    (re.compile(r"llama-?3\.[123]", re.I), ToolSupport("llama3_json")),
    (re.compile(r"mistral", re.I), ToolSupport("mistral")),
    (re.compile(r"granite", re.I), ToolSupport("granite")),
)


def tool_support(*names: str) -> ToolSupport:
    """The family's parser and template for the first name that matches one."""
    for name in names:
        for pattern, support in _FAMILIES:
            if pattern.search(name):
                return support
    return ToolSupport(None)
