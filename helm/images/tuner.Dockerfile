# The tuning image: vLLM and tiergate in one, for the chart's tuning Job (`tiergate tune`
# starts vLLM engines itself) and the fast tier's gate (the decision's fingerprint names
# the vLLM and torch versions it was measured with, so build it FROM the image the vLLM
# pods run, same tag). From the repository's root:
#   docker build -f helm/images/tuner.Dockerfile -t REGISTRY/tiergate-vllm:0.1.0-v0.32.0 .
#   docker build -f helm/images/tuner.Dockerfile \
#     --build-arg VLLM_IMAGE=public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0 \
#     -t REGISTRY/tiergate-vllm-cpu:0.1.0-v0.32.0 .
# Quantizing a candidate's checkpoint needs llm-compressor (scripts/install-quant.sh), which
# this image leaves out: candidates that quantize reuse checkpoints already on the volume.
ARG VLLM_IMAGE=vllm/vllm-openai:v0.32.0
FROM ${VLLM_IMAGE}
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tiergate ./tiergate
# tiergate's own dependencies beside vLLM's; vLLM and torch stay as the base image has them.
# (vLLM's images install with uv; pip when the image has it.)
RUN if python3 -m pip --version >/dev/null 2>&1; then python3 -m pip install --no-cache-dir .; \
    else uv pip install --system --no-cache .; fi && rm -rf /src
WORKDIR /
ENV PYTHONUNBUFFERED=1
ENTRYPOINT []
CMD ["tiergate", "--help"]
