"""``molrl demo --study``: the verdict rule in closed form, and the quick study end to end (slow)."""

from __future__ import annotations

import re

import pytest

from molrl.cli import main
from molrl.demo.study_report import cell, verdict


def test_verdict_needs_every_seed_and_two_standard_errors():
    # d = [0.1, 0.1, 0.7]: mean 0.3, sd = sqrt((0.04 + 0.04 + 0.16) / 2) = 0.3464, se = 0.2; 0.3 < 2 se
    assert verdict([0.1, 0.1, 0.7]) == "mixed"
    assert verdict([0.2, 0.2, 0.2]) == "reproduced"  # se 0
    assert verdict([0.0, 0.0, 0.0]) == "not reproduced"
    assert verdict([-0.3, 0.1, -0.2]) == "mixed"


def test_cell_gives_mean_standard_error_and_seeds():
    # values 0.2, 0.4: mean 0.3, sd 0.1414, se 0.1
    assert cell([0.2, 0.4], 2) == "0.30 ± 0.10 [0.20, 0.40]"


@pytest.mark.slow
def test_quick_study_fills_every_table(tmp_path):
    assert main(["demo", "--study", "--quick", "--seeds", "2", "--out", str(tmp_path)]) == 0
    report = (tmp_path / "study.md").read_text()
    for title in ("## 1. MoL vs CE", "## 2. MoL length", "## 3. GRPO vs Dr.GRPO", "## 4. Staged vs binary",
                  "## Headline over 2 seeds"):
        assert title in report
    number = r"\d\.\d+ ± \d\.\d+"
    rows = [line for line in report.splitlines() if line.startswith("| ") and re.search(number, line)]
    # 6 loss rows, 4 MoL-length rows, 2 algorithm rows, 2 reward rows, and the headline: base+grpo against
    # mol_1ep+grpo, mol+grpo and mol_demo+grpo, 2 models x 3 benchmarks each
    assert len(rows) == 6 + 4 + 2 + 2 + 18
    for row in rows:  # every cell after the row's labels holds a number
        cells = [c.strip() for c in row.strip("|").split("|")]
        numeric = [c for c in cells if re.fullmatch(r"[\d.]+ ± [\d.]+( \[.*\])?|[\d.]+–[\d.]+|[\d., ]+", c)]
        assert len(numeric) >= len(cells) - 2 and "nan" not in row, row
    verdicts = re.findall(r"\*\*: (reproduced|not reproduced|mixed) \(", report)
    assert len(verdicts) == 4 + 3 + 1 + 2
    assert re.search(r"staged − binary on code after GRPO: [+-]\d\.\d{3} ± \d\.\d{3}", report)
    for label in ("| 1.0 (", "| 3.0 (", "steps, the demo's) |"):  # MoL lengths read from the runs
        assert label in report
    for png in ("decision_kl.png", "completion_length.png", "general_vs_heldout.png", "code_reward_stages.png"):
        assert (tmp_path / "plots" / png).stat().st_size > 10_000
    expert = (tmp_path / "seed-0" / "expert" / "traces.jsonl").read_text()
    assert "I will ask the tool." in expert
    code_rl = (tmp_path / "seed-0" / "world" / "code_rl_train.jsonl").read_text()
    assert "Write solve() returning f(" in code_rl and "preamble" not in code_rl


def test_expert_words_its_turns_unlike_the_base_but_prints_the_same():
    from molrl.demo.base import ToolDemonstrator
    from molrl.demo.expert import StyledExpert

    question = "<|im_start|>user\nWhat is f(478)?<|im_end|>\n<|im_start|>assistant\n"
    code = StyledExpert.turn(question)
    assert code != ToolDemonstrator.turn(question)
    program = code.split("<execute>")[1].split("</execute>")[0]
    printed: list[str] = []
    exec(program, {"f": lambda n: 3, "print": lambda *a: printed.append(" ".join(map(str, a)))})
    assert printed == ["f(478) = 3"]  # the same feedback line the base's own code produces
    answer = StyledExpert.turn(question + "<tool_response>\nOutput:\nf(478) = 3\n</tool_response>")
    assert answer.endswith("\\boxed{3}.") and answer != ToolDemonstrator.turn("Output:\nf(478) = 3\n")


def test_only_the_study_presets_build_the_code_family():
    from molrl.demo.run import PRESETS

    assert {name for name, preset in PRESETS.items() if preset.world.code_problems or preset.world.code_heldout} == \
        {"study", "study_quick"}
