"""One settings tree (issue 36 item 4): every environment variable tiergate's servers read
is a field of :class:`tiergate.settings.Settings`, under the name it is set by, and no
module reads ``os.environ`` besides."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tiergate.settings import SettingsError, load_settings
from tiergate.tiers import Tier

PACKAGE = Path(__file__).resolve().parents[2] / "tiergate"

# Modules that read a variable that is not tiergate's servers' (each by the key's source):
# the jobs client runs in the caller's process and takes its base URL and key as the openai
# client does (TIERGATE_BASE_URL, TIERGATE_API_KEY); the local stack's disk check asks
# where vLLM caches (VLLM_CACHE_ROOT, vLLM's own variable); the jobs bench copies the
# environment for its servers without tiergate's variables (a filtered copy, ``*``).
NOT_THE_SERVERS = {
    "jobsclient/base.py": {"BASE_URL_ENV", "API_KEY_ENV"},
    "stack.py": {"'VLLM_CACHE_ROOT'"},
    "bench/jobs/stack.py": {"*"},
}


def test_the_process_variables_are_fields_of_the_tree(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIERGATE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TIERGATE_QUANT_PYTHON", "/opt/quant/bin/python")
    monkeypatch.setenv("TIERGATE_GPU_NAME", "h100-80gb")
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "metrics"))
    s = load_settings()
    assert s.cache_dir == tmp_path / "cache"
    assert str(s.quant_python) == "/opt/quant/bin/python"
    assert s.gpu_name == "h100-80gb"
    assert s.prometheus_multiproc_dir == str(tmp_path / "metrics")
    assert s.config is None
    # What lives under the cache follows it: the models the profiles serve and the decision.
    model = tmp_path / "cache" / "models" / "SmolLM2-135M-Instruct"
    assert {p.model for p in s.profiles.values()} == {str(model)}
    assert s.tuning.decision_path() == tmp_path / "cache" / "models" / "tier-decision.json"


def test_defaults_without_the_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("TIERGATE_CACHE_DIR", "TIERGATE_GPU_NAME", "PROMETHEUS_MULTIPROC_DIR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", "")  # empty is unset, as the library reads it
    s = load_settings()
    assert s.cache_dir == Path.home() / ".cache" / "tiergate"
    assert s.gpu_name == "none" and s.prometheus_multiproc_dir is None
    assert s.quant_python.name == "python" and s.quant_python.parent.parent.name == ".venv-quant"
    # A decision file named in the tree is kept, not moved under the cache.
    named = load_settings(tuning={"decision_file": "/data/decision.json"})
    assert named.tuning.decision_path() == Path("/data/decision.json")
    assert named.profiles[Tier.STANDARD].model.startswith(str(s.cache_dir))


def test_the_config_file_is_named_by_the_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    config = tmp_path / "tiergate.yaml"
    config.write_text("gateway: {port: 9123}\ngpu_name: from-the-file\n")
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))
    s = load_settings()
    assert s.config == config and s.gateway.port == 9123 and s.gpu_name == "from-the-file"
    monkeypatch.setenv("TIERGATE_CONFIG", str(tmp_path / "missing.yaml"))
    with pytest.raises(SettingsError, match="TIERGATE_CONFIG: no such file"):
        load_settings()


def _environment_reads(tree: ast.AST) -> list[str]:
    """What a module reads of ``os.environ``: ``os.environ.get(X)``, ``os.getenv(X)``,
    ``os.environ[X]`` loaded, ``X in os.environ``, and iterating it (``for k in
    os.environ``), each as the source of its key. Copies handed to a child process
    (``dict(os.environ)``, ``{**os.environ}``) and writes are not reads."""

    def is_environ(node: ast.AST) -> bool:
        return isinstance(node, ast.Attribute) and node.attr == "environ"

    reads = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and (
                (func.attr == "get" and is_environ(func.value)) or func.attr == "getenv"
            ):
                reads.append(ast.unparse(node.args[0]) if node.args else "?")
            if (
                isinstance(func, ast.Attribute)
                and func.attr in ("items", "keys")
                and is_environ(func.value)
            ):
                reads.append("*")
        elif isinstance(node, ast.Subscript) and is_environ(node.value):
            if isinstance(node.ctx, ast.Load):
                reads.append(ast.unparse(node.slice))
        elif isinstance(node, ast.Compare) and any(is_environ(c) for c in node.comparators):
            reads.append(ast.unparse(node.left))
        elif isinstance(node, ast.comprehension) and is_environ(node.iter):
            reads.append("*")
    return reads


def test_no_module_reads_the_environment_but_the_tree() -> None:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        name = path.relative_to(PACKAGE).as_posix()
        reads = _environment_reads(ast.parse(path.read_text()))
        unexpected = [r for r in reads if r not in NOT_THE_SERVERS.get(name, set())]
        if unexpected:
            found[name] = unexpected
    assert found == {}, f"read from os.environ outside the settings tree: {found}"


def test_the_scan_sees_each_kind_of_read() -> None:
    """The scan above is not blind: each way of reading is found, copies are not."""
    source = "\n".join(
        [
            "import os",
            "a = os.environ.get('A')",
            "b = os.getenv('B')",
            "c = os.environ['C']",
            "d = 'D' in os.environ",
            "e = [k for k in os.environ]",
            "f = dict(os.environ)",
            "g = {**os.environ}",
            "os.environ['H'] = '1'",
        ]
    )
    assert _environment_reads(ast.parse(source)) == ["'A'", "'B'", "'C'", "'D'", "*"]


def test_a_wrong_setting_is_named_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A failing field is the message's only line: the defaults derived from the tree (the
    profiles, from cache_dir) add no line of their own."""
    monkeypatch.setenv("TIERGATE_GATEWAY__PORT", "eighty")
    with pytest.raises(SettingsError) as refused:
        load_settings()
    lines = str(refused.value).splitlines()[1:]
    assert len(lines) == 1 and lines[0].strip().startswith("gateway.port:"), lines
