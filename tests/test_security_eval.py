"""``provmark eval security --attack oracle`` at a toy size: the attacks run, the defences show, results resume."""

import json

from api.cli import main
from evaluation.security import SecurityConfig, run_security

SMALL = ["--units", "4", "--max-pairs", "2", "--power-texts", "2", "--prefix-tokens", "40", "--no-progress"]


def test_oracle_attacks_before_and_after_the_defences(tmp_path, capsys):
    out = tmp_path / "sec"
    assert main(["eval", "security", "--attack", "oracle", *SMALL, "--out", str(out)]) == 0
    assert "target_met" in capsys.readouterr().out
    results = json.loads((out / "results.json").read_text())
    before, after = results["attacks"]["before"], results["attacks"]["after"]
    # before: one query per unit reads the colour exactly; every caller-chosen spec is answered
    assert before["one_position"]["balanced_accuracy"] == 1.0 and before["gamma_step"]["balanced_accuracy"] == 1.0
    assert before["spec_switch"]["refused"] == 0
    # after: the one-position view carries nothing (chance), other specs are refused outright
    assert after["one_position"]["balanced_accuracy"] == 0.5
    assert after["spec_switch"]["refused"] == after["spec_switch"]["queries"] > 0
    assert after["gamma_step"]["refused"] == after["gamma_step"]["queries"] > 0
    assert set(after["paired_difference"]["accuracy_by_pairs"]) == {"1", "2"}
    assert [row["green_fraction"] for row in results["power"]] and (out / "oracle_accuracy.png").exists()
    summary = results["summary"]["after"]
    assert summary["daily_budget_tokens"] > 0 and summary["budget_tokens_per_unit"] > 0


def test_a_second_run_keeps_finished_sections(tmp_path):
    config = SecurityConfig(units=2, max_pairs=2, prefix_tokens=40, power_texts=2)
    run_security(config, tmp_path, progress=False)
    path = tmp_path / "results.json"
    results = json.loads(path.read_text())
    results["attacks"]["after"]["one_position"]["marker"] = "kept"
    path.write_text(json.dumps(results))
    again = run_security(config, tmp_path, progress=False)
    assert again["attacks"]["after"]["one_position"]["marker"] == "kept"  # resumed, not recomputed
    changed = run_security(SecurityConfig(units=2, max_pairs=2, prefix_tokens=40, power_texts=2, seed=1), tmp_path,
                           progress=False)
    assert "marker" not in changed["attacks"]["after"]["one_position"]  # other settings: a fresh run


def test_bad_settings_are_a_clear_cli_error(tmp_path, capsys):
    assert main(["eval", "security", "--units", "1", "--out", str(tmp_path)]) != 0
    assert "--units" in capsys.readouterr().err
