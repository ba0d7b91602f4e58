"""The local stack's fitting thread (tiergate.fastfit) ends in a state the gateway shows,
whatever stops it: a checkpoint build that exits (SystemExit, as the quantization tools
say they cannot run) leaves the fast tier ``unfitted`` with the reason, not ``starting``
for good. The plan is a fake that raises; no engine starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tiergate import fastfit
from tiergate.engine.process import Engine
from tiergate.fastfit import FastTierFitter
from tiergate.fitting import Fitting
from tiergate.local.supervisor import Supervisor
from tiergate.settings import load_settings


@pytest.mark.parametrize("error", [SystemExit("no quantization environment"), RuntimeError("x")])
def test_a_fitting_that_cannot_build_says_unfitted(
    error: BaseException, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def plan(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(fastfit, "tier_plan", plan)
    settings = load_settings(
        cache_dir=str(tmp_path), profiles={"fast": {"model": "m", "port": 9, "tuned": False}}
    )
    fitting = Fitting(None)
    said: list[str] = []
    standard = Engine("standard", "http://127.0.0.1:9", "m", None)
    fitter = FastTierFitter(
        settings, standard, fitting, Supervisor(said.append), tmp_path, say=said.append
    )
    fitter.start()
    fitter.wait(10)
    assert fitting.unready_reason() == "unfitted"
    assert str(error) in fitting.describe()["detail"]
    assert any("will not join" in line for line in said), said
