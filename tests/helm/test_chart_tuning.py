"""Tier fitting in the cluster: the tuning Job and the fast tier's gate on its decision."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    find,
    pod_spec,
    render,
)
from tiergate.enginesettings import Recipe
from tiergate.evidence import TierDecision
from tiergate.measure.fingerprint import digest, hardware_fingerprint
from tiergate.settings import Settings, load_settings
from tiergate.tuning.tuner import inputs_digest


def _gate() -> ModuleType:
    path = CHART / "files" / "tier_decision.py"
    spec = importlib.util.spec_from_file_location("tier_decision", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tuning_job_and_the_fast_tiers_gate() -> None:
    docs = render(CHART / "ci" / "gpu-production.yaml")
    job = next(d for d in docs if d["kind"] == "Job")
    pod = job["spec"]["template"]["spec"]
    tune = pod["containers"][0]
    assert tune["command"][:2] == ["tiergate", "tune"]
    env = {e["name"]: e.get("value") for e in tune["env"]}
    assert env["TIERGATE_GPU_NAME"] == "h100-80gb"
    assert "VLLM_API_KEY" not in env  # its engines are its own, on localhost
    hardware = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert pod["nodeSelector"] == hardware
    assert tune["resources"]["limits"]["nvidia.com/gpu"] == 1
    mounts = {m["mountPath"]: m for m in tune["volumeMounts"]}
    assert not mounts["/models"].get("readOnly")
    fast = pod_spec(docs, "Deployment", "rel-tiergate-vllm-fast")
    assert fast["nodeSelector"] == hardware
    (gate,) = fast["initContainers"]
    assert gate["image"] == tune["image"]
    gate_env = {e["name"]: e.get("value") for e in gate["env"]}
    assert gate_env["TIERGATE_FAST_MODE"] == "values"
    assert gate_env["TIERGATE_GPU_NAME"] == env["TIERGATE_GPU_NAME"]
    assert json.loads(gate_env["TIERGATE_FAST_ARGS"]) == [
        a for a in fast["containers"][0]["args"] if a.startswith(("--model=", "--speculative"))
    ]
    assert "initContainers" not in pod_spec(docs, "Deployment", "rel-tiergate-vllm-standard")
    # The Job and the gate read one settings file; the decision lives on the model volume.
    config = find(docs, "ConfigMap", "rel-tiergate-tuning")["data"]
    assert config["tier_decision.py"] == (CHART / "files" / "tier_decision.py").read_text()
    tuning = yaml.safe_load(config["tiergate.yaml"])
    assert tuning["tuning"]["decision_file"] == (
        "/models/tiergate/decisions/h100-80gb/tier-decision.json"
    )
    assert tuning["profiles"]["standard"]["model"] == "/models/Llama-3.1-8B-Instruct"
    assert tuning["profiles"]["fast"]["tuned"] is True
    # A changed tuning input is a new Job (a Job's template cannot change).
    other = render(CHART / "ci" / "gpu-production.yaml", sets=("tuning.budgetSeconds=120",))
    assert (
        next(d for d in other if d["kind"] == "Job")["metadata"]["name"] != job["metadata"]["name"]
    )
    kinds = {d["kind"] for d in render(CHART / "ci" / "cpu-small.yaml")}
    assert "Job" not in kinds


def _decision(settings: Settings, chosen: Recipe | None) -> TierDecision:
    fingerprint = hardware_fingerprint(settings.gpu_name)
    return TierDecision(
        fingerprint=fingerprint,
        fingerprint_digest=digest(fingerprint),
        inputs_digest=inputs_digest(settings),
        decided_at=0.0,
        seconds=1.0,
        engine_mode="compiled",
        chosen=chosen,
        verdict="faster" if chosen else "equal",
        reason="test",
    )


def _gate_setup(
    values: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> tuple[Settings, dict[str, Any], Path]:
    docs = render(values)
    fast = pod_spec(docs, "Deployment", "rel-tiergate-vllm-fast")
    gate = fast["initContainers"][0]
    config = tmp_path / "tuning.yaml"
    config.write_text(find(docs, "ConfigMap", "rel-tiergate-tuning")["data"]["tiergate.yaml"])
    for item in gate["env"]:
        monkeypatch.setenv(item["name"], item["value"])
    monkeypatch.setenv("TIERGATE_CONFIG", str(config))
    # The volume's path here instead of /models (an environment variable wins over the file).
    monkeypatch.setenv("TIERGATE_TUNING__DECISION_FILE", str(tmp_path / "tier-decision.json"))
    monkeypatch.setenv("TIERGATE_WAIT_SECONDS", "0.05")
    monkeypatch.setenv("TIERGATE_POLL_SECONDS", "0.01")
    return load_settings(), fast, tmp_path / "fast-args.json"


def test_the_gate_waits_for_an_agreeing_decision(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _gate()
    settings, fast, out = _gate_setup(CHART / "ci" / "gpu-production.yaml", tmp_path, monkeypatch)
    decision_file = settings.tuning.decision_path()
    assert gate.main(["tier_decision.py", str(out)]) == 2  # no decision yet
    assert "no tier decision" in gate.waiting_for(settings)
    # Measured on other hardware: still waiting, and saying so.
    other = _decision(settings, None)
    other.fingerprint_digest = "0" * 16
    other.save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 2
    assert "measured on" in gate.waiting_for(settings)
    # A decision for another recipe than the values run: the fast tier refuses to start.
    eagle = {
        "method": "eagle3",
        "model": "/models/EAGLE3-LLaMA3.1-Instruct-8B",
        "num_speculative_tokens": 3,
    }
    _decision(settings, Recipe(name="bf16 + eagle3", speculative=eagle)).save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 1
    assert not out.exists()
    # The decision agrees with the values (W4A16 + EAGLE-3): it starts, as configured.
    chosen = Recipe(name="W4A16 + eagle3", quantize="W4A16", speculative=eagle)
    _decision(settings, chosen).save(decision_file)
    assert gate.main(["tier_decision.py", str(out)]) == 0
    configured = [
        a for a in fast["containers"][0]["args"] if a.startswith(("--model=", "--speculative"))
    ]
    assert json.loads(out.read_text()) == configured


def test_the_gate_hands_vllm_the_decided_recipe(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _gate()
    settings, fast, out = _gate_setup(CHART / "ci" / "cpu-tuned.yaml", tmp_path, monkeypatch)
    container = fast["containers"][0]
    # The decided recipe replaces the values' model and speculation.
    assert container["command"][:2] == ["python3", "-c"]
    assert "/run/tiergate/fast-args.json" in container["command"][2]
    assert not any(a.startswith(("--model", "--speculative")) for a in container["args"])
    assert fast["nodeSelector"] == {"node.kubernetes.io/instance-type": "c6i.2xlarge"}
    ngram = {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
    }
    recipe = Recipe(name="bf16 + ngram", speculative=ngram)
    _decision(settings, recipe).save(settings.tuning.decision_path())
    assert gate.main(["tier_decision.py", str(out)]) == 0
    args = json.loads(out.read_text())
    assert args[0] == "--model=/models/SmolLM2-135M-Instruct"
    assert json.loads(args[1].split("=", 1)[1]) == ngram
    # The standard configuration itself: the standard checkpoint, no speculation.
    _decision(settings, None).save(settings.tuning.decision_path())
    assert gate.main(["tier_decision.py", str(out)]) == 0
    assert json.loads(out.read_text()) == ["--model=/models/SmolLM2-135M-Instruct"]


# --- Transport and identity ----------------------------------------------------------------
