from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tiergate.accesssettings import TierAdmission
from tiergate.settings import SettingsError, load_settings
from tiergate.tiers import Tier


def test_defaults_describe_the_local_stack() -> None:
    s = load_settings()
    assert s.gateway.port == 8000
    assert s.tiers[Tier.STANDARD].endpoints == ["http://127.0.0.1:8101"]
    # The fast tier's recipe is not a constant: the tuner's decision fills it in.
    assert s.profiles[Tier.FAST].tuned and not s.profiles[Tier.STANDARD].tuned
    assert s.profiles[Tier.FAST].model == s.profiles[Tier.STANDARD].model
    assert any(r.lossless for r in s.tuning.candidates)
    assert s.tuning.decision_path().name == "tier-decision.json"


def test_environment_overrides_nested_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERGATE_GATEWAY__PORT", "9001")
    monkeypatch.setenv("TIERGATE_POLICY__AUTO_TIER", "fast")
    s = load_settings()
    assert s.gateway.port == 9001
    assert s.policy.auto_tier == "fast"


def test_yaml_file_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    config = tmp_path / "tiergate.yaml"
    config.write_text(
        "tiers:\n"
        "  standard: {endpoints: ['http://a:8000']}\n"
        "  fast: {dns: {name: fast-headless.ns.svc, port: 8000}}\n"
        "policy: {fallback: false}\n"
    )
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))
    s = load_settings()
    assert s.tiers[Tier.FAST].dns is not None and s.tiers[Tier.FAST].dns.name.startswith("fast")
    assert s.policy.fallback is False


@pytest.mark.parametrize(
    ("env", "value", "named"),
    [
        ("TIERGATE_GATEWAY__PORT", "eighty", "gateway.port"),
        ("TIERGATE_HEALTH__EJECT_AFTER_FAILURES", "0", "health.eject_after_failures"),
        ("TIERGATE_POLICY__AUTO_TIER", "turbo", "policy.auto_tier"),
        (
            "TIERGATE_TIERS",
            '{"standard": {"endpoints": ["ftp://x"]}, "fast": {}}',
            "tiers.standard.endpoints",
        ),
        ("TIERGATE_TIERS", '{"standard": {}}', "missing pool for fast"),
    ],
)
def test_a_wrong_setting_is_named(
    monkeypatch: pytest.MonkeyPatch, env: str, value: str, named: str
) -> None:
    monkeypatch.setenv(env, value)
    with pytest.raises(SettingsError, match=named.replace(".", r"\.")):
        load_settings()


def test_unknown_setting_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("gateway: {prot: 1}\n")
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))
    with pytest.raises(SettingsError, match=r"gateway\.prot"):
        load_settings()


def test_cli_stops_with_the_setting_named() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "tiergate", "backend", "--tier", "fast", "--dry-run"],
        env={"TIERGATE_GATEWAY__PORT": "-5", "PATH": "/usr/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert "gateway.port" in proc.stderr


def test_documented_gpu_profile_is_valid(monkeypatch: pytest.MonkeyPatch) -> None:
    from tiergate.engine.command import vllm_command

    path = Path(__file__).resolve().parents[2] / "examples" / "gpu-llama-8b.yaml"
    monkeypatch.setenv("TIERGATE_CONFIG", str(path))
    s = load_settings()
    fast = s.profiles[Tier.FAST]
    assert fast.quantize is not None and fast.quantize.scheme == "W4A16"
    cmd = vllm_command(fast, python="python")
    assert '"method":"eagle3"' in cmd[cmd.index("--speculative-config") + 1]
    assert "--enforce-eager" not in cmd


def test_kafka_client_options_carry_sasl_and_tls() -> None:
    from tiergate.jobsettings import KafkaSettings

    plain = KafkaSettings(bootstrap_servers="b:9092").client_options()
    assert plain == {"bootstrap_servers": "b:9092", "security_protocol": "PLAINTEXT"}
    secure = KafkaSettings(
        bootstrap_servers="b:9093",
        security_protocol="SASL_SSL",
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="tiergate",
        sasl_password="secret",
        ssl_cafile="/etc/kafka/ca.pem",
    )
    options = secure.client_options()
    assert options["sasl_plain_username"] == "tiergate" and options["ssl_cafile"].endswith("ca.pem")
    assert "secret" not in repr(secure)


def test_an_admission_tree_naming_one_tier_keeps_the_others_defaults() -> None:
    """It stopped the gateway at start with a KeyError for the tier left out."""
    settings = load_settings(admission={"tiers": {"standard": {"max_concurrent": 1}}})
    tiers = settings.admission.tiers
    assert tiers[Tier.STANDARD].max_concurrent == 1
    assert tiers[Tier.FAST] == TierAdmission()
