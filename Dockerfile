# tiergate's own image, for the gateway and the job workers (vLLM pods use the upstream
# vLLM image). Small, non-root, with bubblewrap for the workers' sandbox and mmdebstrap for
# building job environments (`tiergate env build`, the chart's environment Job, as root).
#   docker build -t REGISTRY/tiergate:0.1.0 . && docker push REGISTRY/tiergate:0.1.0
# The base is pinned to a Python patch release and a Debian release, never a floating tag,
# so that which interpreter (and which tarfile, bubblewrap and libc) the workers run is
# known: 3.11.14 carries the fix for CVE-2025-4517. Pin a digest on top where your
# registry policy asks for one: --build-arg PYTHON_IMAGE=python:3.11.14-slim-bookworm@sha256:...
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tiergate ./tiergate
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${PYTHON_IMAGE}
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap tini mmdebstrap \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 10001 --create-home --shell /usr/sbin/nologin tiergate
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
USER 10001:10001
ENV PYTHONUNBUFFERED=1
EXPOSE 8000
ENTRYPOINT ["/usr/bin/tini", "--", "tiergate"]
CMD ["serve", "--host", "0.0.0.0"]
