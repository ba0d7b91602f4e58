# tiergate's own image, for the gateway and the job workers (vLLM pods use the upstream
# vLLM image). Small, non-root, with bubblewrap for the workers' sandbox and mmdebstrap for
# building job environments (`tiergate env build`, the chart's environment Job, as root).
#   docker build -t REGISTRY/tiergate:0.1.0 . && docker push REGISTRY/tiergate:0.1.0
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tiergate ./tiergate
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM python:3.11-slim
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
