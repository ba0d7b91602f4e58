#!/usr/bin/env bash
# The quantization environment (.venv-quant): llm-compressor pins transformers and
# compressed-tensors versions that vLLM's cannot share, so it gets an environment of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-quant
STAMP=$VENV/.installed
WANT="torch==2.13.0 llmcompressor==0.14.0.1 datasets"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
echo "[install-quant] creating $VENV with $WANT (about 1 minute)" >&2
python3 -m venv "$VENV"
"$VENV/bin/pip" install --progress-bar off -q $WANT >&2
echo "$WANT" > "$STAMP"
