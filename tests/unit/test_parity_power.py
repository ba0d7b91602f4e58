"""The parity judge's statement of its own power (tiergate/quant/power.py)."""

from __future__ import annotations

import random

from tiergate.quant.parity import bootstrap_ratio
from tiergate.quant.power import task_power


def test_the_tasks_needed_give_the_target_power_and_fewer_do_not() -> None:
    for discordant_share in (0.05, 0.1, 0.2, 0.3):
        needed = int(task_power(int(discordant_share * 1000), 1000, 0.08, 0.95)["tasks_needed"])
        at_needed = task_power(round(discordant_share * needed), needed, 0.08, 0.95)
        fewer = task_power(round(discordant_share * needed * 0.7), int(needed * 0.7), 0.08, 0.95)
        assert float(at_needed["power_if_no_loss"]) >= 0.94
        assert float(fewer["power_if_no_loss"]) < 0.94


def test_a_recipe_losing_the_margin_passes_about_one_time_in_twenty() -> None:
    figures = task_power(37, 183, 0.08, 0.95)
    assert 0.03 <= float(figures["pass_chance_if_margin_loss"]) <= 0.06
    assert task_power(0, 183, 0.08, 0.95)["power_if_no_loss"] == 1.0


def test_the_stated_power_is_the_judges_own_rule_simulated() -> None:
    # The judge's rule (the paired bootstrap's 5% bound above -0.08), applied to simulated
    # comparisons of a recipe that loses nothing with 20% discordant tasks over 183 tasks,
    # passes about as often as task_power says (0.78), within the simulation's error.
    rng = random.Random(7)
    stated = float(task_power(37, 183, 0.08, 0.95)["power_if_no_loss"])
    runs, passed = 60, 0
    for run in range(runs):
        diffs = [rng.choice((-1, 1)) if rng.random() < 0.2 else 0 for _ in range(183)]
        low = bootstrap_ratio([(float(d), 1.0) for d in diffs], 0.05, seed=run)
        passed += low >= -0.08
    assert abs(passed / runs - stated) < 0.16, (passed / runs, stated)
