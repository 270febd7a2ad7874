"""Every value of every stage's config is checked against its declared range before anything loads.

The cases are generated from the declarations (``molrl.config.ranges``): for each number key, the values just
outside its range, NaN and the infinities, and a float where an integer is required; for each named vocabulary,
an unknown name; for each run directory, an existing file. Each goes through the real CLI entry.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import subprocess
import sys
import typing
from pathlib import Path

import pytest

from molrl.cli import main
from molrl.collect.config import CollectConfig
from molrl.config.ranges import Creatable, OneOf, Range, ranges
from molrl.eval.config import EvalConfig
from molrl.mol.config import MolConfig
from molrl.pipeline.config import PipelineConfig
from molrl.rl.config import RlConfig

ROOT = Path(__file__).resolve().parents[1]

# stage -> (its config class, the arguments it needs besides the override, the function that would load a model)
STAGES = {
    "mol": (MolConfig, [], "molrl.mol.run.run_mol"),
    "rl": (RlConfig, [], "molrl.rl.run.run_rl"),
    "eval": (EvalConfig, ["model=tiny:chatml"], "molrl.eval.run.run_eval"),
    "collect": (CollectConfig, ["model=tiny:chatml", "data.path=tasks.jsonl", "output_dir=out"],
                "molrl.collect.run.run_collect"),
    "pipeline": (PipelineConfig, [], "molrl.pipeline.run_pipeline"),
}


def _item(base: typing.Any) -> tuple[typing.Any, tuple, bool]:
    """A key's number type and markers, entering a list of numbers (``in_list``)."""
    if typing.get_origin(base) is list:
        inner = typing.get_args(base)[0]
        if typing.get_origin(inner) is typing.Annotated:
            return typing.get_args(inner)[0], inner.__metadata__, True
        return inner, (), True
    return base, (), False


def numeric_keys() -> list[tuple[str, str, type, Range, bool]]:
    """(stage, key, int or float, its Range, whether the key is a list of such numbers) for every number key."""
    out = []
    for stage, (cls, _, _) in STAGES.items():
        for key, (base, markers) in ranges(cls).items():
            number, inner_markers, in_list = _item(base)
            if number in (int, float):
                found = [m for m in (*markers, *inner_markers) if isinstance(m, Range)]
                out.append((stage, key, number, found[0] if found else None, in_list))
    return out


def outside(number: type, rng: Range) -> list[str]:
    """Override texts of values outside ``rng``: just below and above it, NaN, infinities, a float for an int."""
    if number is int:
        low, high = (rng.low if rng.low_open else rng.low - 1), (rng.high if rng.high_open else rng.high + 1)
        while low in rng.also:
            low -= 1
        return [str(int(low)), str(int(high)), "1.5", "1e21", "1.0e+21", ".nan", *HUGE]
    low = rng.low if rng.low_open else math.nextafter(rng.low, -math.inf)
    high = rng.high if rng.high_open else math.nextafter(rng.high, math.inf)
    return [repr(low), repr(high), ".nan", ".inf", "-.inf", *HUGE]


HUGE = ["9" * 400, "-" + "9" * 400]
"""Integers of 400 digits: past what a float holds, so the range is checked before any float conversion."""


def range_cases() -> list[tuple[str, str, str, str]]:
    """(stage, override, the key the error names, what it must say is allowed) for every number key."""
    cases = []
    for stage, key, number, rng, in_list in numeric_keys():
        for text in outside(number, rng):
            override = f"{key}=[{text}]" if in_list else f"{key}={text}"
            cases.append((stage, override, f"{key}[0]" if in_list else key, rng.describe(number is int)))
    return cases


def vocabulary_cases() -> list[tuple[str, str, str, str]]:
    """The same for every key with a fixed vocabulary: an unknown name (and, for a list, none at all)."""
    cases = []
    for stage, (cls, _, _) in STAGES.items():
        for key, (base, markers) in ranges(cls).items():
            for marker in markers:
                if isinstance(marker, OneOf):
                    is_list = typing.get_origin(base) is list
                    wrong = ["[no_such_name]", "[]"] if is_list else ["no_such_name"]
                    cases += [(stage, f"{key}={w}", key, marker.describe()) for w in wrong]
    return cases


def text_keys() -> list[tuple[str, str, bool]]:
    """(stage, key, whether it is a list) of every key holding a path or a free string (eval's ``data.NAME.path``,
    under a mapping the walk does not enter, named by hand)."""
    out = [("eval", "data.mbpp.path", False), ("eval", "predictions.mbpp", False)]
    for stage, (cls, _, _) in STAGES.items():
        for key, (base, markers) in ranges(cls).items():
            item = typing.get_args(base)[0] if typing.get_origin(base) is list else base
            if item in (str, Path) and not any(isinstance(m, OneOf) for m in markers):
                out.append((stage, key, typing.get_origin(base) is list))
    return out


def run_dir_keys() -> list[tuple[str, str]]:
    """(stage, key) of every run directory."""
    return [(stage, key) for stage, (cls, _, _) in STAGES.items() for key, (_, markers) in ranges(cls).items()
            if any(isinstance(m, Creatable) for m in markers)]


@pytest.fixture
def refused(tmp_path, monkeypatch, cli_logs, caplog):
    """Run one stage with one override and return its error lines; fail if the stage would load anything."""
    monkeypatch.chdir(tmp_path)

    def loaded(*args, **kwargs):
        raise AssertionError("the stage went on to load with a value outside its range")

    for _, _, target in STAGES.values():
        monkeypatch.setattr(target, loaded)

    def run(stage: str, override: str) -> list[str]:
        caplog.clear()
        rc = main([stage, *STAGES[stage][1], override])
        lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
        assert rc == 1, (override, lines)
        return lines

    return run


def test_every_number_key_of_every_stage_declares_its_range():
    missing = [f"{stage}: {key}" for stage, key, _, rng, _ in numeric_keys() if rng is None]
    assert missing == []
    assert len(numeric_keys()) > 100  # the walk entered every section (sampling, sandbox, episode, ...)


def test_every_value_outside_its_declared_range_is_one_line_naming_key_and_range(refused):
    cases = range_cases() + vocabulary_cases()
    assert len(cases) > 500
    for stage, override, key, allowed in cases:
        lines = refused(stage, override)
        assert len(lines) == 1, (override, lines)
        assert f" {key}" in lines[0] and f"allowed: {allowed}" in lines[0], (override, lines[0])
        assert "Traceback" not in lines[0] and "\n" not in lines[0] and "9" * 200 not in lines[0], (override, lines[0])


def test_every_run_directory_key_refuses_a_path_through_a_file(refused, tmp_path):
    (tmp_path / "a_file").write_text("")
    for stage, key in run_dir_keys():
        for path in ("/dev/null", tmp_path / "a_file", tmp_path / "a_file" / "run"):
            lines = refused(stage, f"{key}={path}")
            assert len(lines) == 1 and f"{key}={path} is out of range; allowed: a directory" in lines[0]
    assert {stage for stage, _ in run_dir_keys()} == {"mol", "rl", "eval", "collect", "pipeline"}


def test_every_path_and_string_key_refuses_a_nul_byte(refused):
    keys = text_keys()
    assert {"model.path", "model.adapter", "output_dir", "data.traces", "data.path"} <= {k for _, k, _ in keys}
    for stage, key, is_list in keys:
        lines = refused(stage, f"{key}=[a\0b]" if is_list else f"{key}=a\0b")
        assert len(lines) == 1 and "holds a NUL byte" in lines[0], (key, lines)
        assert f" {key}[0]=" in lines[0] if is_list else f" {key}=" in lines[0], (key, lines)


def test_values_inside_their_ranges_are_accepted(tmp_path):
    from molrl.config import load_config

    overrides = ["train.max_steps=-1", "train.max_grad_norm=0", "lora.dropout=0", "train.warmup_ratio=1",
                 "train.seed=4294967295", "threads=1024", "lora.rank=4096", f"output_dir={tmp_path / 'new' / 'run'}"]
    cfg = load_config(MolConfig, None, overrides)
    assert (cfg.train.seed, cfg.threads, cfg.lora.rank) == (2**32 - 1, 1024, 4096)
    assert load_config(RlConfig, None, ["sampling.top_p=1", "sampling.temperature=0.01"]).sampling.top_p == 1.0


REQUIRED = {"collect": ["model=tiny:chatml", "data.path=tasks.jsonl"]}


def test_describe_shows_each_key_s_allowed_values(capsys):
    assert main(["mol", "--describe"]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("lora.rank: 64"))
    assert lines[at + 1] == "    # allowed: an integer in [1, 4096]"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_is_within_its_ranges(path):
    from molrl.config import load_config

    stage = next(s for s in ("pipeline", "mol", "rl", "eval", "collect") if path.name.startswith(s))
    cls = STAGES[stage][0]
    cfg = load_config(cls, path, REQUIRED.get(stage, []))
    if stage == "pipeline":  # its stage sections too, as the pipeline builds them before any work
        from molrl.pipeline import check_stages

        check_stages(dataclasses.replace(cfg, model=cfg.model or "tiny:chatml"), Path("runs/pipeline"), True)


# finding 10: these values were accepted and a run started with them
@pytest.mark.parametrize("stage,override", [
    ("rl", "sampling.top_p=2"), ("mol", "lora.alpha=-1"), ("rl", "lora.alpha=-1"), ("mol", "train.warmup_ratio=2"),
    ("mol", "train.max_grad_norm=-1"), ("rl", "train.max_grad_norm=-1"), ("mol", "train.max_steps=0"),
    ("mol", "train.max_steps=-5"), ("mol", "train.max_steps=1e21"), ("rl", "train.max_steps=1e21"),
])
def test_finding_10_values_once_accepted_silently_are_refused(refused, stage, override):
    lines = refused(stage, override)
    assert len(lines) == 1 and f" {override.split('=')[0]}" in lines[0] and "allowed:" in lines[0]


def test_finding_10_duplicate_keys_in_an_override_are_refused(refused):
    lines = refused("mol", "train={seed: 1, seed: 2}")
    assert lines == ["override train=...:1: key 'seed' appears twice in one mapping (first on line 1); keep one"]


def test_finding_10_duplicate_yaml_keys_in_a_file(tmp_path, cli_logs, caplog):
    config = tmp_path / "dup.yaml"
    config.write_text("train:\n  seed: 1\nlora:\n  rank: 4\ntrain:\n  seed: 2\n")
    assert main(["mol", "--config", str(config)]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"{config}:5: key 'train' appears twice in one mapping (first on line 1); keep one"]


# finding 11: these crashed with a traceback after the model had loaded
FINDING_11 = [("mol", "train.learning_rate=-1e-4"), ("rl", "sampling.temperature=-1"), ("mol", "lora.dropout=1.5"),
              ("mol", "lora.rank=1e11"), ("mol", "lora.rank=100000000000"), ("rl", "lora.target_modules=[]"),
              ("mol", "lora.target_modules=[attention]"), ("mol", "train.seed=-1"), ("rl", "train.seed=4294967296"),
              ("mol", "train.optim=adam"), ("rl", "train.lr_scheduler=cosine_annealing"), ("mol", "output_dir=/dev/null"),
              ("mol", "threads=100000"), ("eval", "threads=100000")]


@pytest.mark.parametrize("stage,override", FINDING_11)
def test_finding_11_values_that_crashed_after_loading_are_one_line(refused, stage, override):
    lines = refused(stage, override)
    assert len(lines) == 1 and override.split("=")[0] in lines[0] and "allowed:" in lines[0]


def test_finding_11_a_refused_value_loads_nothing_in_a_fresh_process(tmp_path):
    """In a process of its own: exit code 1, one line on stderr, no traceback, torch never imported."""
    for stage, override in FINDING_11[:4]:
        code = ("import sys; from molrl.cli import main; rc = main(sys.argv[1:]); "
                "print('torch' in sys.modules); sys.exit(rc)")
        done = subprocess.run([sys.executable, "-c", code, stage, override, f"output_dir={tmp_path / 'run'}"],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env={"PYTHONPATH": str(ROOT / "src"), "PATH": "/usr/bin:/bin"})
        assert done.returncode == 1 and done.stdout == "False\n", (override, done.stdout, done.stderr)
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("write,expected", [
    (lambda p: p.write_text("extends: sub\n"), "sub: a folder (extended by"),
    (lambda p: p.write_text("extends: /dev/zero\n"), "/dev/zero: not a regular file (extended by"),
    (lambda p: p.write_bytes(b"train:\n  seed: \xff\n"), ":2: not UTF-8 text (byte 0xff); save the file as UTF-8"),
    (lambda p: p.write_text("train:\n  seed: " + "9" * 5001 + "\n"), "value has 5001 digits; write a smaller number"),
])
def test_finding_11_yaml_files_that_crashed_are_one_line(tmp_path, cli_logs, caplog, write, expected):
    (tmp_path / "sub").mkdir()
    config = tmp_path / "run.yaml"
    write(config)
    assert main(["mol", "--config", str(config)]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and expected in lines[0], lines


def test_finding_11_an_override_of_5001_digits_is_one_line(refused):
    lines = refused("mol", "train.seed=" + "9" * 5001)
    assert len(lines) == 1 and lines[0].endswith("value has 5001 digits; write a smaller number")
    assert len(lines[0]) < 300


def test_a_config_file_over_the_size_cap_is_refused(tmp_path, cli_logs, caplog):
    from molrl.config import MAX_CONFIG_BYTES

    config = tmp_path / "big.yaml"
    config.write_text("# " + "x" * MAX_CONFIG_BYTES + "\n")
    assert main(["mol", "--config", str(config)]) == 1
    assert [r.getMessage() for r in caplog.records] == [f"{config}: over 1 MiB; a config is a small YAML file"]


def test_the_vocabularies_are_names_transformers_knows():
    from transformers.trainer_utils import SchedulerType
    from transformers.training_args import OptimizerNames

    from molrl.config.ranges import OPTIMIZERS, SCHEDULERS

    assert set(OPTIMIZERS) <= {o.value for o in OptimizerNames}
    assert set(SCHEDULERS) <= {s.value for s in SchedulerType}


@pytest.mark.parametrize("flag,value,key", [("--timeout", "-1", "timeout_s=-1.0"), ("--timeout", "nan", "timeout_s=nan"),
                                            ("--memory-mb", "0", "memory_mb=0")])
def test_sandbox_run_checks_its_flags_against_the_sandbox_ranges(tmp_path, cli_logs, caplog, flag, value, key):
    program = tmp_path / "p.py"
    program.write_text("print(1)\n")
    assert main(["sandbox", "run", str(program), flag, value]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and f": {key} is out of range; allowed: " in lines[0]


def test_a_pipeline_section_value_is_refused_before_any_stage_runs(tmp_path, cli_logs, caplog):
    out = tmp_path / "run"
    traces = ROOT / "configs" / "data" / "mol_tiny_traces.jsonl"
    assert main(["pipeline", "model=tiny:chatml", f"output_dir={out}", "stages=[mol,rl]", f"traces=[{traces}]",
                 "rl.data.format=toy", "rl.sampling.top_p=2"]) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "pipeline section rl_runs.rl: defaults + the pipeline config: sampling.top_p=2.0 is out of range; allowed: a number "
        "in (0, 1]"]
    assert not out.exists() or not any(out.rglob("*"))


@pytest.mark.parametrize("stage,overrides,says", [
    ("rl", ["sampling.n=3", "train.micro_batch_size=2"], "train.micro_batch_size=2 must divide"),
    ("rl", ["model.reference=mol"], "model.reference=mol needs model.adapter"),
    ("eval", ["sampling.n=2", "sampling.temperature=0"], "sampling.n=2 with greedy decoding"),
])
def test_cross_key_checks_run_at_load_time_too(tmp_path, monkeypatch, cli_logs, caplog, stage, overrides, says):
    monkeypatch.setattr(STAGES[stage][2], lambda *a, **k: pytest.fail("the stage went on to load"))
    assert main([stage, *STAGES[stage][1], *overrides, f"output_dir={tmp_path / 'run'}"]) == 1
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and says in lines[0]
