"""vLLM's OpenAI server (what ``python -m vllm.entrypoints.openai.api_server`` runs), with
one fix: a CPU engine's compile cache is loaded again instead of rebuilt at every start.

vLLM 0.32's loader (``vllm/compilation/decorators.py``, ``_try_load_aot_compiled_fn``)
calls ``compiled_fn.finalize_loading(vllm_config)``, which only vLLM's own
``VllmSerializableFunction`` has. On CPU the platform compiles with torch's stock
``inductor`` backend (``CompilationMode.DYNAMO_TRACE_ONCE``, ``vllm/platforms/cpu.py``),
so the saved graph comes back as torch's ``BundledAOTAutogradSerializableCallable``,
whose ``__getattr__`` forwards the lookup to the plain function inside: AttributeError,
"Compiling model again due to a load failure", and every compiled start costs the whole
compile again (145 s against 40 s from cache for the 135M model on a 2-core Xeon). That
wrapper's deserializer has loaded it whole already, so a no-op ``finalize_loading`` is
right for it (the upstream fix is a ``hasattr`` check at that call; README, "Notes").

The patch runs at import, so it also runs in vLLM's engine process, which the CPU platform
starts with multiprocessing's "spawn" (spawn imports the main module again as
``__mp_main__``). It patches nothing when torch has no such class or already defines the
method, and it imports nothing of tiergate's beyond this module.
"""

from __future__ import annotations

from typing import Any


def patch_finalize_loading() -> bool:
    """Give torch's bundled AOT callable a no-op ``finalize_loading``; True if patched."""
    try:
        from torch._dynamo.aot_compile_types import BundledAOTAutogradSerializableCallable
    except ImportError:  # a torch without AOT compile: nothing to load, nothing to patch
        return False
    if "finalize_loading" in vars(BundledAOTAutogradSerializableCallable):
        return False

    def finalize_loading(self: Any, vllm_config: Any) -> None:
        return None

    setattr(BundledAOTAutogradSerializableCallable, "finalize_loading", finalize_loading)  # noqa: B010
    return True


patch_finalize_loading()


if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()  # type: ignore[no-untyped-call]
