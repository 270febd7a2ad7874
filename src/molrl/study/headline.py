"""``headline.md``: the four models of the headline over seeds, on a pretrained model.

Base, base + GRPO, MoL and MoL + GRPO, each seed's pipeline run with the pretrained model as its base: the chain
world's (``molrl demo --model``; the model warmed up on the world's formats) or a code task's
(``benchmarks/headline_code.py``). Per model: single-step pass@1 on the held-out problems and on the general problems
(task accuracy), and two measures of what it kept of the base on the general prompts, as the real-model benchmark
measures them:

- *general KL*: the full-vocabulary KL(model || base) per token on the base's own greedy answers to the general
  prompts (the base's answers are its evaluation's completions);
- *agreement*: the share of general prompts whose greedy answer equals the base's, text for text (both from the
  evaluation's greedy completions).

Verdicts follow the study's rule (``molrl.study.verdict``) on paired per-seed differences. The KL figures are
kept in each seed's ``pipeline/forgetting.json`` (recomputed only when a model's run changed).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Sequence

from molrl.demo.seeds import cell
from molrl.records.jsonl import read_records
from molrl.study.metrics import Score, scorer
from molrl.study.report import plot_general_vs_heldout
from molrl.study.claims import CLAIMS, Claim
from molrl.study.verdict import RULE, claim_line, primary_note
from molrl.records.writes import write_text

log = logging.getLogger(__name__)

MODELS = ("base", "base+grpo", "mol", "mol+grpo")
"""The headline's four models, by their pipeline names."""
REFERENCE_CONTROL = "mol+grpo_refmol"
"""GRPO from MoL with its KL reference the MoL model (``model.reference=mol``), where the pipeline runs it: the
control that tells whether ``mol+grpo``'s KL to the model before MoL undoes what MoL absorbed."""
KL_CHUNK = 8
"""Prompts per forward pass of the KL measurement (a [chunk, length, vocabulary] logits tensor each)."""


def seed_dirs(out: Path, seeds: int) -> list[Path]:
    """Each seed's pipeline directory of a ``molrl demo`` run in ``out`` (seed 0 in ``out`` itself)."""
    return [(out if seed == 0 else out / f"seed-{seed}") / "pipeline" for seed in range(seeds)]


CHAIN_INTRO = ("`{model}` is warmed up once on the chain world's formats (tool use and the answer format, in decoy "
               "worlds of a chain world of its own, never a seed's rule; `molrl.demo.pretrained_base`): that is the "
               "base. Each seed builds its chain world, collects the base's own traces in the sandbox, trains MoL on "
               "them, runs the same GRPO from the MoL model and from the base, and evaluates in a single step without "
               "feedback: held-out rule problems (n = {n_held} a seed) and general problems (n = {n_general} a seed, "
               "the public rules).")
"""The chain world's description in ``headline.md`` (``{model}``, ``{n_held}``, ``{n_general}`` filled in)."""
LIBRARY_INTRO = ("`{model}` is warmed up once in decoy libraries (probing a library's functions in the sandbox, "
                 "then writing the function; and direct answers; never a seed's library; "
                 "`molrl.demo.library_base`): that is the base. Each seed builds its library world, collects the "
                 "base's own traces in the sandbox, trains MoL on them, runs the same GRPO from the MoL model and from "
                 "the base, and evaluates in a single step without execution, on held-back tests: held-out tasks "
                 "(new pairs of functions on new items, n = {n_held} a seed) and plain-Python general tasks "
                 "(n = {n_general} a seed).")
"""The library world's description in ``headline.md``."""


GENERIC_FOLDERS = frozenset({"model", "models", "base", "final", "merged", "export", "exported", "output", "weights"})
"""Folder names that say nothing of the model in them: a title names their parent folder too."""


def model_label(model: str) -> str:
    """A short name of ``model`` for a title: a Hub id or a folder's last part, with its parent where that part is
    generic (``runs/smollm2/model`` -> ``smollm2/model``, ``out/checkpoint-8`` -> ``out/checkpoint-8``)."""
    path = Path(model)
    name = path.name or model
    generic = name.lower() in GENERIC_FOLDERS or name.lower().startswith("checkpoint-")
    if generic and path.parent.name:
        return f"{path.parent.name}/{name}"
    return name


def write_headline(out: str | Path, seeds: int, model: str, *, task: str = "chain world", held_bench: str = "heldout",
                   general_bench: str = "general", intro: str = CHAIN_INTRO, extra: Sequence[str] = ()) -> Path:
    """Write ``out/headline.md`` and ``out/plots/headline.png`` over ``seeds`` seeds; returns the report's path.

    ``held_bench`` and ``general_bench`` name the evaluation's benchmarks for held-out and general problems; ``intro``
    describes the runs (``{model}``, ``{n_held}``, ``{n_general}`` filled in); ``extra`` lines go after the verdicts.
    """
    out = Path(out)
    run_dirs = seed_dirs(out, seeds)
    score = scorer(run_dirs)
    models = (*MODELS, *((REFERENCE_CONTROL,) if all((d / "eval" / REFERENCE_CONTROL).is_dir() for d in run_dirs)
                         else ()))
    kept = [forgetting(d, models, general_bench) for d in run_dirs]
    kl = {m: [k[m]["general_kl"] for k in kept] for m in models}
    agree = {m: [k[m]["agreement"] for k in kept] for m in models}
    held = {m: score(m, held_bench) for m in models}
    general = {m: score(m, general_bench) for m in models}
    n_held, n_general = (counts_text([problem_count(d, "base", b) for d in run_dirs])
                         for b in (held_bench, general_bench))
    lines = [f"# The headline on a pretrained model: {model_label(model)}, {task} ({seeds} seed"
             f"{'s' * (seeds != 1)})", "",
             intro.format(model=model, n_held=n_held, n_general=n_general) + " General KL is KL(model || base) per "
             "token on the base's greedy answers to the general prompts; agreement is the share of those prompts "
             "answered exactly as the base does. A cell is mean ± standard error over seeds [per seed].", "",
             "| model | held-out | general | general KL | agreement with the base |", "|---|---|---|---|---|"]
    for m in models:
        lines.append(f"| `{m}` | {cell(held[m])} | {cell(general[m])} | {cell(kl[m], 4)} | {cell(agree[m])} |")
    lines += ["", "Verdicts compare paired per-seed differences d: " + RULE, ""]
    claims_at = len(lines)

    def accuracy_claim(key: str, bench: str, side: str, other: str, primary: bool = False, **fields: str) -> str:
        return paired_accuracy_claim(CLAIMS[key].fill(**fields), run_dirs, score, side, other, bench, primary)

    lines += [accuracy_claim("headline", held_bench, "mol+grpo", "base+grpo", primary=True),
              accuracy_claim("absorbs", held_bench, "mol", "base"),
              accuracy_claim("grpo_learns", held_bench, "base+grpo", "base"),
              accuracy_claim("grpo_adds", held_bench, "mol+grpo", "mol"),
              accuracy_claim("mol_forgets", general_bench, "base", "mol"),
              accuracy_claim("mol_grpo_forgets", general_bench, "base+grpo", "mol+grpo"),
              claim_line(CLAIMS["mol_grpo_moves"], kl["mol+grpo"], kl["base+grpo"])]
    if REFERENCE_CONTROL in models:
        lines.append(accuracy_claim("reference_keeps", held_bench, REFERENCE_CONTROL, "mol+grpo",
                                    control=REFERENCE_CONTROL))
    lines += ["", *extra, *([""] if extra else [])]
    lines[claims_at:claims_at] = [primary_note(lines), ""]
    plots = out / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    figure = plot_general_vs_heldout(lambda m, b: held[m] if b == "heldout" else general[m], plots / "headline.png",
                                     models)
    lines += [f"![held-out against general per model](plots/{figure.name})", "",
              "Each seed's own report: `pipeline/report.md` (seed 0) and `seed-N/pipeline/report.md`.", ""]
    report = out / "headline.md"
    write_text(report, "\n".join(lines))
    return report


def paired_accuracy_claim(claim: Claim, run_dirs: Sequence[Path], score: Score, side: str, other: str, bench: str,
                          primary: bool = False, nested: bool = False) -> str:
    """The verdict line of ``claim`` on ``bench``'s accuracy, ``side`` against ``other`` (``score`` from
    ``scorer(run_dirs)``), its standard error counting the problems where every seed scored the same ones, and with
    ``nested`` each seed's own problems (``claim_line``)."""
    return claim_line(claim, score(side, bench), score(other, bench), paired_problem_scores(run_dirs, side, other, bench),
                      primary, nested)


def paired_problem_scores(run_dirs: Sequence[Path], side: str, other: str, bench: str
                          ) -> tuple[list[dict[str, float]], list[dict[str, float]]]:
    """Per seed, ``side``'s and ``other``'s pass@1 per problem of ``bench``, keyed alike: by content key, or by id
    wherever either side's evaluation was written before content keys were kept (a seed's two sides score the same
    tasks, so within a seed the id pairs them)."""
    keyed = tuple([problem_scores(d, m, bench) for d in run_dirs] for m in (side, other))
    if all(set(a) == set(b) for a, b in zip(*keyed)):
        return keyed
    by_id = tuple([problem_scores(d, m, bench, by_content=False) for d in run_dirs] for m in (side, other))
    if len(run_dirs) > 1:  # ids alone cannot say whether two seeds scored the same problems: never pair them
        by_id = tuple([{f"{i}/{k}": v for k, v in seed.items()} for i, seed in enumerate(sides)] for sides in by_id)
    return by_id


def counts_text(counts: Sequence[int]) -> str:
    """One count when every seed has it, else each seed's (a pretrained base's seeds leave out, each, the problems
    its warm-up saw).

    >>> counts_text([200, 200]), counts_text([183, 186, 192])
    ('200', '183, 186 and 192 on seeds 0-2')
    """
    if len(set(counts)) <= 1:
        return str(counts[0]) if counts else "0"
    return f"{', '.join(map(str, counts[:-1]))} and {counts[-1]} on seeds 0-{len(counts) - 1}"


def problem_count(run_dir: Path, model: str, bench: str) -> int:
    """Problems of ``bench`` in ``model``'s evaluation."""
    return sum(1 for _ in read_records(run_dir / "eval" / model / bench / "samples.jsonl"))


def problem_scores(run_dir: Path, model: str, bench: str, by_content: bool = True) -> dict[str, float]:
    """``model``'s pass@1 per problem of ``bench`` (the share of its samples graded correct), by the problem's
    content key (``Task.content_key``) where every record has one, else (or with ``by_content`` False) by its id:
    two seeds' problems pair only when they are the same problem, not merely under the same id."""
    records = list(read_records(run_dir / "eval" / model / bench / "samples.jsonl"))
    field = "task_key" if by_content and all(r.get("task_key") for r in records) else "id"
    samples: dict[str, list[bool]] = {}
    for r in records:
        samples.setdefault(str(r[field]), []).append(bool(r["correct"]))
    return {i: sum(c) / len(c) for i, c in samples.items()}


def greedy_answers(run_dir: Path, model: str, bench: str) -> dict[str, str]:
    """``model``'s first completion per problem of ``bench`` (greedy evaluation), by problem id."""
    return {r["id"]: r["completion"] for r in read_records(run_dir / "eval" / model / bench / "samples.jsonl")
            if r.get("sample", 0) == 0}


def step_marks(completion: str, key: str, start: int, steps: int) -> list[bool]:
    """Per step of the chain f^steps(start), first step first: whether the answer's step of that rank applies f
    rightly to the input it should (the question's start, then the value the answer stated at its step before).

    A step is judged on the answer's own previous value, so one wrong step costs that step, not every later one.

    >>> step_marks("Output:\\n3: f(472) = 3\\n2: f(3) = 9\\n1: f(9) = 8\\n\\\\boxed{8}", "1032547698", 472, 3)
    [True, False, True]
    >>> step_marks("Output:\\n2: f(471) = 0\\n", "1032547698", 472, 2)  # the wrong input, then no second step
    [False, False]
    """
    from molrl.demo.chain_base import RULE_STEP

    stated = RULE_STEP.findall(completion)[:steps]
    marks, expected = [], str(start)
    for rank in range(steps):
        if rank >= len(stated):
            marks.append(False)
            continue
        given, value = stated[rank]
        marks.append(given == expected and int(value) == int(key[int(given) % 10]))
        expected = value
    return marks


def step_accuracy(run_dir: Path, model: str, key: str, bench: str = "heldout") -> dict[int, tuple[int, int]]:
    """(steps right, steps) of ``model``'s greedy answers to the rule chains of ``bench`` by the step's rank (1:
    the chain's first step, on the question's three-digit start; 2 on: one-digit inputs), ``key`` the world's f."""
    out: dict[int, tuple[int, int]] = {}
    for problem, completion in greedy_answers(run_dir, model, bench).items():
        name, start, steps = problem.split("/")
        if name != "f":
            continue
        for rank, right in enumerate(step_marks(completion, key, int(start), int(steps)), 1):
            done, total = out.get(rank, (0, 0))
            out[rank] = (done + right, total + 1)
    return out


def forgetting(run_dir: Path, models: Sequence[str] = MODELS, bench: str = "general") -> dict[str, dict[str, float]]:
    """Per model: KL to the base on the base's greedy answers to ``bench``, and greedy agreement with the base; kept
    in ``run_dir/forgetting.json`` keyed by each model's run marker, so a finished measurement is reused."""
    from molrl.pipeline.config import load_pipeline_config

    cfg = load_pipeline_config(run_dir / "config.yaml")
    cache_file = run_dir / "forgetting.json"
    cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    base_answers = greedy_answers(run_dir, "base", bench)
    out: dict[str, dict[str, float]] = {}
    todo = []
    for m in models:
        marker = (run_dir / "eval" / m / "DONE").read_text() if (run_dir / "eval" / m / "DONE").is_file() else ""
        answers = greedy_answers(run_dir, m, bench)
        same = sum(answers.get(i) == a for i, a in base_answers.items()) / max(len(base_answers), 1)
        if m == "base":
            out[m] = {"general_kl": 0.0, "agreement": same}
        elif same_run(cache.get(m, {}).get("marker", ""), marker):
            out[m] = {"general_kl": cache[m]["general_kl"], "agreement": same}
        else:
            todo.append((m, marker, same))
    if todo:
        for (m, marker, same), value in zip(todo, general_kls(cfg, run_dir, [t[0] for t in todo], base_answers,
                                                                bench)):
            out[m] = {"general_kl": value, "agreement": same}
            cache[m] = {"marker": marker, "general_kl": value}
        write_text(cache_file, json.dumps(cache, indent=1))
    return out


def same_run(marker: str, other: str) -> bool:
    """Whether two DONE markers' texts name the same finished evaluation for the forgetting measures: the same
    contents of its inputs (the model's weights, the task files), by their fingerprints. What a marker says besides
    (the seconds it took, the config's key names) changes when a finished evaluation is graded again under a newer
    grading or saved under renamed keys; its model and its answers do not.

    >>> a = '{"seconds": 3, "config": {"custom": {}}, "inputs": {"data.x": {"fingerprint": "f1"}}}'
    >>> same_run(a, '{"seconds": 9, "config": {}, "inputs": {"data.x.path": {"fingerprint": "f1"}}}'), same_run("", "")
    (True, True)
    >>> same_run(a, '{"seconds": 3, "config": {"custom": {}}, "inputs": {"data.x": {"fingerprint": "f2"}}}')
    False
    """
    def identity(text: str) -> Any:
        if not text.strip():
            return None
        done = json.loads(text)
        if "inputs" in done:
            return sorted(str(v.get("fingerprint")) for v in done["inputs"].values())
        return {k: v for k, v in done.items() if k != "seconds"}
    return identity(marker) == identity(other)


def general_kls(cfg: Any, run_dir: Path, models: Sequence[str], answers: dict[str, str],
                bench: str = "general") -> list[float]:
    """KL(model || base) per token on ``answers`` (the base's greedy answers, by problem id of ``bench``), per model;
    the prompts are the ones the evaluation posed (its config's loader, templates and thinking)."""
    import torch

    from molrl.eval.suites import load_suite
    from molrl.models import load_model, load_tokenizer
    from molrl.pipeline import model_weights
    from molrl.pipeline.config import eval_config
    from molrl.rl.kl import policy_base_kl
    from molrl.traces.spans import render_prompts

    evaluation = eval_config(cfg, "base", cfg.model, None, run_dir)
    tasks = {t.id: t for t in load_suite(bench, evaluation)}
    ids = [i for i in answers if i in tasks]
    tokenizer = load_tokenizer(cfg.model)
    prompts = render_prompts(tokenizer, [tasks[i] for i in ids], enable_thinking=evaluation.thinking,
                             code_template=evaluation.code_prompt, math_template=evaluation.math_prompt)
    values = []
    for m in models:
        base_path, adapter = model_weights(cfg, m, run_dir)
        policy = load_model(base_path, adapter=adapter)
        total = tokens = 0.0
        for start in range(0, len(ids), KL_CHUNK):
            chunk = slice(start, start + KL_CHUNK)
            count = sum(len(tokenizer(answers[i], add_special_tokens=False)["input_ids"]) + 1 for i in ids[chunk])
            with torch.no_grad():
                kl = policy_base_kl(policy, policy.disable_adapter, tokenizer, prompts[chunk],
                                    [answers[i] for i in ids[chunk]])
            total, tokens = total + kl * count, tokens + count
        values.append(total / max(tokens, 1))
        log.info("%s: general KL to the base %.4f per token over %d answers", m, values[-1], len(ids))
    return values
