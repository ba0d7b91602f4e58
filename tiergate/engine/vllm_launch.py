"""vLLM's OpenAI server (what ``python -m vllm.entrypoints.openai.api_server`` runs), with
two fixes: a CPU engine's compile cache is loaded again instead of rebuilt at every start,
and engines of one configuration pinned to different cores share it.

vLLM 0.32's loader (``vllm/compilation/decorators.py``, ``_try_load_aot_compiled_fn``)
calls ``compiled_fn.finalize_loading(vllm_config)``, which only vLLM's own
``VllmSerializableFunction`` has. On CPU the platform compiles with torch's stock
``inductor`` backend (``CompilationMode.DYNAMO_TRACE_ONCE``, ``vllm/platforms/cpu.py``),
so the saved graph comes back as torch's ``BundledAOTAutogradSerializableCallable``,
whose ``__getattr__`` forwards the lookup to the plain function inside: AttributeError,
"Compiling model again due to a load failure", and every compiled start costs the whole
compile again (145 s against 40 s from cache for the 135M model on a 2-core Xeon). That
wrapper's deserializer has loaded it whole already, so a no-op ``finalize_loading`` is
right for it (the upstream fix is a ``hasattr`` check at that call; docs/notes.md).

The patch runs at import, so it also runs in vLLM's engine process, which the CPU platform
starts with multiprocessing's "spawn" (spawn imports the main module again as
``__mp_main__``). It patches nothing when torch has no such class or already defines the
method, and it imports nothing of tiergate's beyond this module.
"""

from __future__ import annotations

import contextlib
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


def _cores_named(spec: str) -> str:
    """``"0-3,8"`` -> ``"5"``; per-rank lists (``"0-1|2-3"``) -> ``"2|2"``."""
    counts = []
    for rank in spec.split("|"):
        count = 0
        for part in filter(None, (p.strip() for p in rank.split(","))):
            low, _, high = part.partition("-")
            count += int(high or low) - int(low) + 1
        counts.append(str(count))
    return "|".join(counts)


def patch_core_binding_factor() -> bool:
    """Key the compile cache on how many cores an engine is bound to, not which.

    vLLM hashes every ``VLLM_*`` variable into the compile cache's key
    (``vllm.envs.compile_factors``), ``VLLM_CPU_OMP_THREADS_BIND`` among them, so two
    engines of one configuration pinned to different cores (the local stack's standard
    engine on core 0, its fast engine on core 1) each compile the model for minutes. The
    generated code depends on the thread count, which the count of cores keeps in the
    key, not on the cores' numbers. True if patched."""
    try:
        import vllm.envs as vllm_envs
    except ImportError:
        return False
    original = vllm_envs.compile_factors
    if getattr(original, "tiergate_patched", False):
        return False

    def compile_factors() -> dict[str, object]:
        factors = original()
        bind = factors.get("VLLM_CPU_OMP_THREADS_BIND")
        if isinstance(bind, str) and bind and bind[0].isdigit():
            with contextlib.suppress(ValueError):  # a form not known here: vLLM's own key
                factors["VLLM_CPU_OMP_THREADS_BIND"] = f"cores:{_cores_named(bind)}"
        return factors

    compile_factors.tiergate_patched = True  # type: ignore[attr-defined]
    vllm_envs.compile_factors = compile_factors
    return True


patch_finalize_loading()
patch_core_binding_factor()


if __name__ == "__main__":
    from vllm.entrypoints.launchers.api_server.entry import main

    main()  # type: ignore[no-untyped-call]
