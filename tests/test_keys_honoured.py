"""Shown means honoured: every key a stage's ``--describe`` shows changes what the stage does or is refused by its
range. A key read only under a setting (some runs read it, others do not) is in ``molrl.config.idle``'s rule table,
which refuses it, set where it does nothing, as the config loads (``tests/test_config_idle.py`` checks every row);
what only a run can tell, a multi-turn run whose every episode ran out of tokens after one turn, is named in one
line."""

from __future__ import annotations

import json
import logging
import time
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from molrl.config import load_config
from molrl.rl.config import RlConfig, rl_sampling, rl_train
from molrl.rl.rollouts.turns import Turns
from molrl.sandbox import SandboxConfig, SandboxPool
from molrl.task_types import Task


# a combination that makes a key do nothing, named at run time
class NoActionTurns(Turns):
    """The multi-turn policy with a scripted sampler: every turn is ``turn_tokens`` tokens of prose, cut at its
    budget without an action, and no model scores the batch."""

    def generate(self, sequences, budgets):
        prose = self.trainer.processing_class("Let me think about it. " * 20, add_special_tokens=False)["input_ids"]
        return [prose[:b] for b in budgets], [True] * len(sequences), [None] * len(sequences)

    def to_batch(self, inputs, *rest, **kwargs):
        return SimpleNamespace(records=None)


def one_turn_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ran out of its sampling.max_new_tokens" in r.getMessage()]


@pytest.mark.parametrize("max_new_tokens,named", [(128, True), (1000, False)])
def test_a_multi_turn_run_with_no_room_for_a_second_turn_is_named_once(max_new_tokens, named, caplog):
    """episode.max_turns=2, turn_tokens=64, max_new_tokens=128: the first turn's format feedback does not fit, so every
    episode ends after one turn; with 1000 tokens the second turn is taken and nothing is said."""
    from molrl.tiny import build_tiny_tokenizer

    tok = build_tiny_tokenizer("chatml")
    cfg = RlConfig(sampling=rl_sampling(n=2, max_new_tokens=max_new_tokens), train=rl_train(micro_batch_size=2))
    cfg.episode.max_turns, cfg.episode.turn_tokens = 2, 64
    metrics = defaultdict(list)
    task = Task(id="t", prompt="What is 2 + 2?", kind="math", answer="4")
    inputs = [{"prompt": "", "task_json": task.to_json()}] * 2
    caplog.set_level(logging.WARNING)
    with SandboxPool(SandboxConfig(workers=1, timeout_s=10)) as pool:
        trainer = SimpleNamespace(processing_class=tok, eos_token_ids=[tok.convert_tokens_to_ids("<|im_end|>")],
                                  scorer=SimpleNamespace(pool=pool), metrics=lambda: metrics,
                                  state=SimpleNamespace(num_input_tokens_seen=0), engine=None)
        policy = NoActionTurns(trainer, cfg)
        for _ in range(2):  # two steps, one line
            policy.rollout(inputs)
    assert metrics["turns/mean"] == ([1.0, 1.0] if named else [2.0, 2.0])
    lines = one_turn_lines(caplog)
    assert len(lines) == (1 if named else 0)
    if named:
        assert lines[0].startswith("episode.max_turns=2, but every episode of this step ran out of its "
                                   "sampling.max_new_tokens=128 after one turn (a turn takes up to "
                                   "episode.turn_tokens=64 tokens, and the feedback and next turn's header after it "
                                   "need up to ")
        assert lines[0].endswith("raise sampling.max_new_tokens or lower episode.turn_tokens")


# every key --describe shows, read by a tiny run or refused by its range
STAGES = ("collect", "mol", "rl", "eval", "pipeline")


def stage_class(stage: str) -> type:
    from molrl.collect.config import CollectConfig
    from molrl.eval.config import EvalConfig
    from molrl.mol.config import MolConfig
    from molrl.pipeline.config import PipelineConfig

    return {"collect": CollectConfig, "mol": MolConfig, "rl": RlConfig, "eval": EvalConfig,
            "pipeline": PipelineConfig}[stage]


def described(stage: str) -> list[str]:
    """Every key ``molrl STAGE --describe`` lists."""
    from molrl.config import describe

    return [line.split(":")[0] for line in describe(stage_class(stage)) if not line.startswith(" ")]


def only_default(stage: str, key: str) -> bool:
    """Whether the key's range admits its default alone, so any other value is refused as the config loads."""
    import dataclasses
    import typing

    from molrl.config.ranges import Range, _markers

    cls = stage_class(stage)
    *sections, name = key.split(".")
    for part in sections:
        cls = typing.get_type_hints(cls)[part]
    tp = typing.get_type_hints(cls, include_extras=True)[name]
    ranges = [m for m in _markers(tp)[1] if isinstance(m, Range)]
    literal = typing.get_args(typing.get_type_hints(cls)[name]) if typing.get_origin(
        typing.get_type_hints(cls)[name]) is typing.Literal else ()
    default = next(f.default for f in dataclasses.fields(cls) if f.name == name)
    return (any(r.low == r.high == default and not r.also for r in ranges)) or literal == (default,)


REPO = Path(__file__).resolve().parents[1]


def task_files(root: Path, shared_data: Path) -> tuple[Path, Path]:
    """Two molrl task files: four demo-world problems (math answers, a sandbox preamble and probe) and two MBPP
    problems (code with tests)."""
    from molrl.demo.run import task_record
    from molrl.demo.world import WorldConfig, build_world
    from molrl.tasks.loaders import load_tasks

    world = build_world(WorldConfig(train_problems=4, heldout_problems=2, general_train=2, general_eval=2))
    code = load_tasks(shared_data / "mbpp" / "mbpp.jsonl", "mbpp", limit=2)
    files = root / "math.jsonl", root / "code.jsonl"
    for path, tasks in zip(files, (world.rule_train, code)):
        path.write_text("".join(json.dumps(task_record(t)) + "\n" for t in tasks))
    return files


def watched_run(reads: Any, cls: type, overrides: list[str], go: Any) -> Any:
    """Load ``cls`` from ``overrides``, watch its every section, run it with ``go``."""
    return go(reads.watch(load_config(cls, None, overrides)))


MOL_RUNS = {"topk": ["loss.base_targets=topk", "loss.base_topk=8", "loss.base_targets_check_steps=1"],
            "mol": ["loss.mode=mol"], "ce": ["loss.mode=ce", "loss.monitor_kl=false"]}
"""MoL's runs: its KL terms read in mode mol, the monitor in the ce modes, the base's cached targets with topk."""
RL_RUNS = {
    "ppo_turns": ["algorithm=ppo", "ppo.critic=separate", "episode.max_turns=2", "episode.turn_tokens=8",
                  "sampling.max_new_tokens=400", "sampling.stop=[END]", "macro.rule=turn", "data.path={code}",
                  "data.spec.kind=code", "model.adapter={mol}", "model.adapter_mode=merge_new", "model.reference=mol",
                  "beta=0.1", "eval.every_steps=1", "eval.data.path={code}", "eval.data.format=jsonl",
                  "eval.data.spec.kind=code", "eval.kl_prompts=1", "eval.max_new_tokens=4"],
    "opd_partial": ["algorithm=opd", "rollout.partial=true", "opd.teacher=model", "opd.teacher_model={mol}/adapter",
                    "eval.every_steps=1", "eval.data.path={math}", "eval.data.format=jsonl", "eval.data.spec.kind=math",
                    "eval.kl_prompts=1", "eval.max_new_tokens=4"],
    "ppo_props": ["algorithm=ppo", "ppo.critic=shared", "rollout.behaviour=props", "rollout.buffer_batches=1"],
}
"""rl's runs: each algorithm's and rollout policy's section read by one of them."""


@pytest.fixture(scope="module")
def read_keys(tiny_runs) -> dict[str, set[str]]:
    """The keys read through each stage's watched configs, all its runs together."""
    return tiny_runs[0]


@pytest.fixture(scope="module")
def run_reads(tiny_runs) -> dict[str, dict[str, set[str]]]:
    """The keys each run of a stage reads, by run."""
    return tiny_runs[1]


@pytest.fixture(scope="module")
def tiny_runs(shared_data, tmp_path_factory) -> tuple[dict[str, set[str]], dict[str, dict[str, set[str]]]]:
    """The keys read through each stage's watched configs, and the keys each of its tiny runs reads: one run each
    (mol's two loss modes, rl's algorithms and rollouts, eval's modes)."""
    from key_reads import Reads

    from molrl.collect.run import run_collect
    from molrl.episode.config import episode_config
    from molrl.eval.run import run_eval
    from molrl.mol.run import run_mol
    from molrl.rl.run import run_rl

    root = tmp_path_factory.mktemp("keys")
    math, code = task_files(root, shared_data)
    reads = {stage: Reads() for stage in STAGES}
    runs: dict[str, dict[str, set[str]]] = {stage: {} for stage in STAGES}

    def watched(stage: str, name: str, cls: type, overrides: list[str], go: Any) -> Any:
        with Reads.one_run() as keys:
            made = watched_run(reads[stage], cls, overrides, go)
        runs[stage][name] = keys
        return made

    with pytest.MonkeyPatch.context() as mp:
        for r in reads.values():
            r.through(mp, episode_config)
        for name, extra in MOL_RUNS.items():
            mol = watched("mol", name, stage_class("mol"), [
                "model=tiny:chatml", f"data.traces=[{REPO / 'configs/data/mol_tiny_traces.jsonl'}]",
                "data.max_length=256", f"data.exclude_benchmarks={{mbpp: {shared_data / 'mbpp/mbpp.jsonl'}}}",
                "lora.rank=4", "train.max_steps=1", "train.micro_batch_size=2", "train.grad_accumulation=1",
                "train.report_to=[none]", f"output_dir={root / name}", *extra], run_mol)
        for name, extra in RL_RUNS.items():
            watched("rl", name, RlConfig, [
                "model=tiny:chatml", f"data.path={math}", "data.format=jsonl", "data.spec.kind=math", "sampling.n=2",
                "sampling.max_new_tokens=8", "train.max_steps=1", "train.micro_batch_size=2", "train.report_to=[none]",
                "lora.rank=4", "sandbox.workers=1", "engine=transformers", f"output_dir={root / name}",
                *[x.format(mol=mol, code=code, math=math) for x in extra]], run_rl)
        common_eval = ["model=tiny:chatml", "limit=1", "sandbox.workers=1", "engine=transformers", "sampling.n=2",
                       "sampling.temperature=0.7", "ks=[1, 2]", "sampling.max_new_tokens=4"]
        from molrl.sandbox.remote.server import SandboxServer, ServeConfig

        with SandboxServer(ServeConfig(sandbox=SandboxConfig(workers=1, cache_size=0), port=0)).start() as server:
            for name, extra in eval_runs(shared_data, root, server.url).items():
                watched("eval", name, stage_class("eval"), [*common_eval, f"output_dir={root / name}", *extra],
                        run_eval)
        watched("collect", "collect", stage_class("collect"), [
            "model=tiny:chatml", f"data.path={math}", "data.format=jsonl", "data.spec.kind=math", "data.limit=2",
            "sampling.n=1", "episode.max_turns=2", "sampling.temperature=0.7", "sampling.max_new_tokens=8",
            "sampling.stop=[END]", "sandbox.workers=1",
            "engine=transformers", "progress=false", f"output_dir={root / 'collect'}"], run_collect)
        with Reads.one_run() as keys:
            pipeline_run(reads["pipeline"], mp, shared_data, root, math)
        runs["pipeline"]["pipeline"] = keys
    return {stage: r.keys for stage, r in reads.items()}, runs


def pipeline_run(reads: Any, mp: Any, shared_data: Path, root: Path, math: Path) -> None:
    """The pipeline's own wiring over every stage, each stage's work a stand-in that leaves what the next reads (the
    stages' keys are their own runs')."""
    import molrl.collect.run
    import molrl.eval.run
    import molrl.mol.run
    import molrl.rl.run
    from molrl.collect.files import collect_files
    from molrl.pipeline import run_pipeline
    from molrl.pipeline.config import load_pipeline_config

    def made(folder: str, *names: str) -> Path:
        for name in names:
            (Path(folder) / name).mkdir(parents=True, exist_ok=True)
        return Path(folder)

    traces = REPO / "configs/data/mol_tiny_traces.jsonl"
    mp.setattr(molrl.collect.run, "run_collect", lambda cfg, tasks=None: collect_files(
        made(cfg.output_dir)).traces.write_text(traces.read_text()))
    mp.setattr(molrl.mol.run, "run_mol", lambda cfg: made(cfg.output_dir, "adapter"))
    mp.setattr(molrl.rl.run, "run_rl", lambda cfg: made(cfg.output_dir, "adapter"))
    mp.setattr(molrl.eval.run, "run_eval", lambda cfg: made(cfg.output_dir))
    cfg = load_pipeline_config(None, [
        "model=tiny:chatml", f"output_dir={root / 'pipeline'}", f"traces=[{traces}]", f"general_traces=[{traces}]",
        "exclude_eval_tasks=true", f"collect.data.path={math}", "collect.data.format=jsonl", "mol_runs=[{name: m}]",
        "rl_runs=[{name: r, start: m}]", "eval.benchmarks=[aime24]",
        f"eval.data.aime24={shared_data / 'aime24/test.jsonl'}",
        "eval_models=[base, m, r]", "title=keys", "threads=1"])
    run_pipeline(reads.watch(cfg))


def eval_runs(shared_data: Path, root: Path, server: str) -> dict[str, list[str]]:
    """eval's runs: one turn, the episode loop, and an MBPP solution graded as a prediction (its code runs in the
    sandbox, as a random tiny model's never does), in the local pool and on the sandbox ``server``."""
    mbpp = shared_data / "mbpp" / "mbpp.jsonl"
    task = json.loads(mbpp.read_text().splitlines()[10])  # MBPP's test split starts at task 11
    (root / "predictions.jsonl").write_text(json.dumps({"id": str(task["task_id"]),
                                                        "completion": f"```python\n{task['code']}\n```"}) + "\n")
    runs = {"single": ["benchmarks=[aime24]", f"data.aime24={shared_data / 'aime24/test.jsonl'}", "mode=single"],
            "interactive": ["benchmarks=[aime24]", f"data.aime24={shared_data / 'aime24/test.jsonl'}",
                            "mode=interactive", "episode.max_turns=2", "sampling.stop=[END]"],
            "predictions": ["benchmarks=[mbpp]", f"data.mbpp={mbpp}",
                            f"predictions={{mbpp: {root / 'predictions.jsonl'}}}",
                            "partial_predictions=true", "limit=2", "sampling.n=1", "ks=[1]"]}
    return {**runs, "remote": [*runs["predictions"], "sandbox.backend=remote", f"sandbox.servers=[{server}]"]}


CRITIC = "read only when the episode's feedback lists critique, which asks a critic model over HTTP " \
         "(molrl.episode.critique; tests/test_episode_critique.py runs it against a local server)"
ALLOWED: dict[tuple[str, str], str] = {
    **{(stage, key): CRITIC for stage in ("collect", "rl", "eval") for key in described(stage)
       if ".critique." in f".{key}"},
    ("rl", "engine_sync_dir"): "read only by engine=vllm_server (molrl.engines.server.policy), which needs vLLM servers",
    ("rl", "engine_gpu_memory_utilization"): "read only by engine=vllm (molrl.rl.engine), which needs vLLM",
    ("rl", "rollout.tis_cap"): "read only by rollout.max_staleness=1, which needs engine servers "
                               "(tests/test_rl_overlap.py runs it against fake ones)",
    ("pipeline", "title"): "read by the report (molrl.report) from the run's saved config, run.json, after the run",
}
"""Keys a stage shows that its tiny runs cannot read, and why each is honoured all the same."""

SAME_CODE: dict[tuple[str, str], tuple[str, str]] = {
    ("collect", "sandbox."): ("eval", "sandbox."), ("rl", "sandbox."): ("eval", "sandbox."),
    ("collect", "data.spec."): ("rl", "data.spec."),
}
"""Sections whose keys one code reads in every stage (``molrl.sandbox.SandboxPool`` a sandbox's, ``molrl.tasks.source``
a task file's spec): where a stage's tiny run cannot reach a key (a random tiny model writes no code to run; collect
reads one task kind), the other stage's run that reads it stands in."""


def stand_in(stage: str, key: str) -> str | None:
    """The (stage, key) whose read stands in for ``key`` of ``stage`` (``SAME_CODE``), or None."""
    for (mine, prefix), (other, theirs) in SAME_CODE.items():
        if mine == stage and key.startswith(prefix):
            return f"{other}:{theirs}{key[len(prefix):]}"
    return None


def honoured(stage: str, key: str, read_keys: dict[str, set[str]]) -> bool:
    """Read by the stage's runs, or by the stand-in stage's where one code reads the section, or refused unless
    at its default by its range."""
    other = stand_in(stage, key)
    return (key in read_keys[stage] or only_default(stage, key)
            or (other is not None and other.split(":")[1] in read_keys[other.split(":")[0]]))


@pytest.mark.parametrize("stage", STAGES)
def test_every_key_a_stage_shows_is_read_by_its_run_or_refused_by_its_range(stage, read_keys):
    unread = [k for k in described(stage) if not honoured(stage, k, read_keys) and (stage, k) not in ALLOWED]
    assert unread == [], f"{stage} shows keys no run reads and its range admits: {', '.join(unread)}"


def test_the_allowance_table_has_no_stale_entry(read_keys):
    stale = [f"{stage}:{key}" for stage, key in ALLOWED
             if key not in described(stage) or honoured(stage, key, read_keys)]
    assert stale == []


def test_each_stand_in_section_is_the_same_type_in_both_stages():
    import typing

    def section(stage: str, prefix: str) -> type:
        cls = stage_class(stage)
        for part in prefix.strip(".").split("."):
            cls = typing.get_type_hints(cls)[part]
        return cls

    assert all(section(*mine) is section(*theirs) for mine, theirs in SAME_CODE.items())


def test_a_key_neither_read_nor_refused_fails_the_enumeration(read_keys):
    """The check itself: a key the runs never read and whose range admits other values is caught."""
    assert not honoured("rl", "ppo.value_coef", {**read_keys, "rl": read_keys["rl"] - {"ppo.value_coef"}})
    assert honoured("rl", "sampling.seed", {**read_keys, "rl": set()})  # rl's range: 0 only


def test_the_recorder_notes_what_a_stage_reads_and_not_what_copies_and_saves_read():
    import copy
    import pickle

    from key_reads import Reads

    from molrl.config import to_dict

    reads, cfg = Reads(), RlConfig()
    reads.watch(cfg)
    assert cfg.sampling.temperature == 0.9 and cfg == RlConfig()
    to_dict(copy.deepcopy(cfg))
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    assert reads.keys == {"sampling", "sampling.temperature"}



# every key read only under a setting, in the rule table that refuses it where it is idle
GENERATION = "read by eval only where it generates; grading predictions made elsewhere reads none of them (eval " \
             "names the model it does not load)"
READ_BY_DATA: dict[tuple[str, str], str] = {
    ("rl", "data.spec."): "a task file's fields are read by its tasks' kind (molrl.tasks.source): code tests, math "
                          "answers",
    **{(stage, "sandbox."): "the sandbox starts where code runs: code tasks, the toy task or agent episodes"
       for stage in ("rl", "eval")},
    **{("eval", key): GENERATION for key in ("model.dtype", "model.seed", "engine", "threads", "sampling.",
                                             "allow_trained_overlap")},
    ("eval", "partial_predictions"): "read only with predictions: a harmless key of a finished eval's re-run "
                                     "(tests/test_finished_runs.py), kept loading without them",
}
"""Keys some of a stage's runs read and others do not, for a reason other than a setting of the config: what the
tasks hold, or eval's grading of predictions."""


def idle_table(stage: str) -> set[str]:
    """The keys of ``stage`` the rule table (``molrl.config.idle.RULES``) covers."""
    from molrl.config.idle import RULES, rule_keys

    return {key for rule in RULES if stage in rule.stages for key in rule_keys(rule, stage_class(stage))}


def read_by_data(stage: str, key: str) -> bool:
    return any(mine == stage and (key == prefix or key.startswith(prefix) and prefix.endswith("."))
               for mine, prefix in READ_BY_DATA)


def read_under_a_setting(stage: str, run_reads: dict[str, dict[str, set[str]]]) -> set[str]:
    """The keys some of a stage's tiny runs read and another does not, and those its runs cannot reach (``ALLOWED``:
    each read only under a setting they leave off)."""
    runs = run_reads[stage].values()
    some, every = set().union(*runs), set.intersection(*runs)
    unreachable = {key for mine, key in ALLOWED if mine == stage}
    return {key for key in (some - every) | unreachable if key in described(stage)}


@pytest.mark.parametrize("stage", ["collect", "mol", "rl", "eval"])
def test_every_key_read_only_under_a_setting_is_in_the_idle_rule_table(stage, run_reads):
    missing = sorted(key for key in read_under_a_setting(stage, run_reads)
                     if key not in idle_table(stage) and not read_by_data(stage, key))
    assert missing == [], f"{stage} reads these keys only under a setting, and no rule refuses them where they are " \
                          f"idle (add them to molrl.config.idle.RULES): {', '.join(missing)}"


def test_the_read_by_data_table_has_no_stale_entry(run_reads):
    stale = [f"{stage}:{prefix}" for stage, prefix in READ_BY_DATA
             if not any(read_by_data(stage, key) for key in read_under_a_setting(stage, run_reads)
                        if key.startswith(prefix))]
    assert stale == []


def test_a_key_read_under_a_setting_outside_the_table_fails_the_enumeration(run_reads):
    """The check itself: a key one run reads and another does not, in no rule, is caught."""
    reads = {**run_reads, "rl": {"reads beta": {"beta"}, "does not": set()}}
    assert "beta" in read_under_a_setting("rl", reads) and "beta" not in idle_table("rl")
