"""What the agent loop tells the model: the system prompts of its two protocols and the
``shell`` tool. The worker sends them, and a batch's rollouts are exported with them, so
that a trainer sees the conversation exactly as the model did."""

from __future__ import annotations

from typing import Any

TEXT_SYSTEM_PROMPT = """You are an agent in a Linux shell, in the directory /workspace.
To run a command, answer with exactly one command in a fenced block, like this:
```bash
ls -la
```
You will then see what it printed and its exit status. Work step by step.
When the task is complete, answer with the single word DONE."""

TOOLS_SYSTEM_PROMPT = """You are an agent in a Linux shell, in the directory /workspace.
Use the shell tool to run commands; you will see their output and exit status. When the
task is complete, answer without calling the tool."""

SHELL_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "shell",
        "description": "Run a shell command in /workspace and return its output.",
        "parameters": {
            "type": "object",
            "properties": {"command": {"type": "string"}},
            "required": ["command"],
        },
    },
}
