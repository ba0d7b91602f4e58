"""The gateway benchmark names what it lacks instead of failing obscurely."""

from __future__ import annotations

import shutil
import sys

import pytest

from tiergate.bench import gateway


def test_missing_vllm_router_fails_clearly(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "executable", "/nonexistent/bin/python")
    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(SystemExit, match="vllm-router") as exc:
        gateway.find_vllm_router()
    assert "pip install vllm-router" in str(exc.value)


def test_cpu_model_is_named() -> None:
    assert gateway.cpu_model() != ""
