"""The RL stage's config: policy, reference, tasks, reward, algorithm, sampling and logging.

Defaults follow the MoL-RL authors' published RL settings (group size 8, temperature 0.9, LoRA
rank 64, learning rate 1e-4 for LoRA). Every field maps either onto the step (``molrl.rl.trainer``), onto
TRL's ``GRPOConfig`` for the loop and generation (``molrl.rl.run.trl_args``), or onto the wiring.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal

from molrl.config.strict import seal
from molrl.config.blocks import LoraAdapterConfig, RlModelSource, TaskSource, TrainConfig, as_model_source
from molrl.sandbox import SandboxConfig
from molrl.config.idle import check_idle
from molrl.config.ranges import Count, Positive, Range, RunDir, Size, Threads, Weight
from molrl.config.renames import Joined, Retired
from molrl.episode.config import EpisodeTurns
from molrl.engines.choice import check_choice
from molrl.engines.registry import EngineName
from molrl.rl.algorithms.names import ENTRIES, AlgorithmName, from_rewards
from molrl.rl.method_settings import MacroSettings, OpdSettings, PpoSettings, PropsSettings, RolloutSettings, TermSettings
from molrl.engines.sampling import HookSampling, RolloutSampling
from molrl.tasks.prompts import CODE_INSTRUCTION, MATH_INSTRUCTION

log = logging.getLogger(__name__)

def _as_is(value: Any) -> Any:
    return value


_NAMED: set[str] = set()
"""The combination lines logged so far (a pipeline builds each stage's config more than once)."""


def _name_once(line: str) -> None:
    """Log ``line`` (a combination of keys that leaves one doing nothing) once per process."""
    if line not in _NAMED:
        _NAMED.add(line)
        log.warning("%s", line)


def rl_sampling(**changes: Any) -> RolloutSampling:
    """The RL stage's default ``sampling`` (the authors': group size 8, temperature 0.9; 1024 tokens a completion),
    with ``changes``."""
    return RolloutSampling(**changes)


def rl_train(**changes: Any) -> TrainConfig:
    """The RL stage's default ``train`` (constant learning rate 1e-4, no warm-up, 100 steps of micro-batches of 8
    completions, TRL's fused AdamW; accumulation and bf16 derived), with ``changes``."""
    return TrainConfig(**{"optim": "adamw_torch_fused", "lr_scheduler": "constant", "warmup_ratio": 0.0,
                          "max_steps": 100, "micro_batch_size": 8, "bf16": None, **changes})


def rl_lora(**changes: Any) -> LoraAdapterConfig:
    """The RL stage's default ``lora`` (rank 64, alpha 128, no dropout, the attention and MLP projections), with
    ``changes``."""
    return LoraAdapterConfig(**{"dropout": 0.0, "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                                  "up_proj", "down_proj"], **changes})


@dataclass
class RewardSettings:
    """How completions are scored."""

    code_mode: Literal["staged", "binary"] = "staged"
    """Code reward: staged partial credit (no code < compile error < runtime error < tests passed), or 0/1."""
    constant_answer_tasks: bool = False
    """Keep code tasks whose held-back tests one constant return passes, the value a shown test expects (copying it
    earns full reward); off, they are left out wherever tests are shown, with one line naming the count."""


@dataclass
class EvalHookSettings:
    """Periodic held-out check during training: single-step accuracy and mean KL to the base."""

    every_steps: Size = 0
    """Run every N optimiser steps (0 = never)."""
    data: TaskSource = field(default_factory=TaskSource)
    """Held-out tasks, a task source as the stage's ``data`` (keep it small: they are sampled and graded at every
    hook)."""
    sampling: HookSampling = field(default_factory=HookSampling)
    """How each held-out answer is sampled: greedily, at most ``max_new_tokens`` (512), ending at ``stop``."""
    kl_prompts: Size = 8
    """Held-out prompts whose greedy answers score the mean per-token KL(policy || base)."""



TRL_SERVER_URL = "http://localhost:8000"
"""The default of the ``engine_server_url`` key that ``engine_mode: server`` (TRL's own server client) read."""


def _server_tier(given: dict[str, Any], data: dict[str, Any], where: str) -> tuple[dict[str, Any], str]:
    """rl's old ``engine_mode`` and ``engine_server_url`` read as molrl's server tier: ``engine=vllm
    engine_mode=server engine_server_url=URL`` is ``engine=vllm_server engine_servers=[URL]`` (single-turn rollouts
    on the server there, now with adapter-only sync, the canary and the gate); colocate, the old default, is
    ``engine=vllm`` as it stands. Anything else meant a setting the tier cannot say, and is refused in one line."""
    from molrl.errors import ConfigError

    mode, url = given.get("engine_mode", "colocate"), given.get("engine_server_url")
    engine = data.get("engine", "auto")
    fix = ("set engine=vllm_server with engine_servers=[URL] and start molrl serve --model MODEL --port PORT at each "
           "URL (trl vllm-serve is no longer used), or remove the old keys")
    if mode == "colocate":
        if url not in (None, TRL_SERVER_URL):
            raise ConfigError(f"{where}: engine_server_url={url!r} did nothing without engine_mode=server, and both "
                              f"keys are gone: {fix}")
        return {}, f"{', '.join(given)} dropped (engine_mode=colocate is engine=vllm, in the trainer's process)"
    if mode != "server" or engine != "vllm":
        raise ConfigError(f"{where}: engine_mode={mode!r} with engine={engine} has no faithful reading now that "
                          f"engine_mode and engine_server_url are gone (the server tier is engine=vllm_server): {fix}")
    url = url or TRL_SERVER_URL
    servers = data.get("engine_servers") or []
    if servers and list(servers) != [url]:
        raise ConfigError(f"{where}: engine_server_url={url!r} beside engine_servers={list(servers)}: {fix}")
    return ({"engine": "vllm_server", "engine_servers": [url]},
            f"engine=vllm engine_mode=server engine_server_url={url} -> engine=vllm_server engine_servers=[{url}] "
            f"(molrl's server tier: start molrl serve --model MODEL at {url} in place of trl vllm-serve)")


@dataclass(slots=True)  # slots: setting a key that is not one (cfg.max_steps, now cfg.train.max_steps) fails loudly
class RlConfig:
    """RL post-training (grpo, dr_grpo, dr_grpo_std, opd, ppo) with sandbox-execution rewards."""

    model: RlModelSource = field(default_factory=lambda: RlModelSource("tiny:chatml"))
    """The base model (``model: PATH`` for short), the MoL stage's adapter the policy starts from (``model.adapter``:
    a PEFT adapter directory or a MoL output directory holding adapter/; none: the plain base), how it starts from
    it (``adapter_mode``), the KL's reference (``reference``) and the dtype."""
    output_dir: RunDir = Path("runs/rl")
    """Where the adapter, config.yaml, metrics.jsonl, completions.jsonl and checkpoints/ go."""
    lora: LoraAdapterConfig = field(default_factory=rl_lora)
    """The LoRA adapter trained on a plain base or after merge_new (continue keeps the MoL adapter's own shape). Its
    dropout, 0 by default, turns every dropout of the model off while training, as TRL does for RL; above 0 it stays
    on, and the loss's log-probs then differ from the sampler's by the dropout's noise."""
    data: TaskSource = field(default_factory=TaskSource)
    """Training tasks (code with tests, or math with answers): what the stage trains on, as MoL's data is."""
    reward: RewardSettings = field(default_factory=RewardSettings)
    """Reward settings."""
    sandbox: SandboxConfig = field(default_factory=lambda: SandboxConfig(workers=4, timeout_s=6.0))
    """The sandbox that runs completions' code for rewards (collect's and eval's settings, 4 workers and 6 s a
    program by default)."""
    eval: EvalHookSettings = field(default_factory=EvalHookSettings)
    """Periodic evaluation hook."""
    algorithm: AlgorithmName = "dr_grpo"
    """The RL algorithm: each name, its class and what it does are in ``molrl.rl.algorithms.names`` (docs/rl.md)."""
    opd: OpdSettings = field(default_factory=OpdSettings)
    """The teacher, lambda and reference of algorithm=opd."""
    ppo: PpoSettings = field(default_factory=PpoSettings)
    """The critic and GAE of algorithm=ppo (its per-token reward KL weight is ``beta``)."""
    macro: MacroSettings = field(default_factory=MacroSettings)
    """Macro actions: the grouping of ppo's GAE, and optional pooling of any algorithm's advantages."""
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    """Partial rollouts, the behaviour policy and the training buffer."""
    episode: EpisodeTurns = field(default_factory=lambda: EpisodeTurns(max_solutions=1))
    """Multi-turn rollouts (``max_turns`` above 1: each completion an agent episode, ``molrl.rl.rollouts.turns``):
    most turns, each turn's tokens, instructions, task wording, solutions and feedback as ``molrl collect`` takes
    them (sampling, the whole budget and thinking: the stage's)."""
    props: PropsSettings = field(default_factory=PropsSettings)
    """The behaviour update of rollout.behaviour=props."""
    loss: TermSettings = field(default_factory=TermSettings)
    """MoL's terms beside the policy gradient, under mol's names: CE on feedback tokens (``loss.ce_weight``), KL to
    the base on decision tokens (``loss.kl_weight``)."""
    thinking: bool = False
    """Render with the chat template's thinking on (Qwen3-style: the model may open a <think> block); off, the
    default in every stage, puts the template's empty think block before each answer."""
    code_prompt: str = CODE_INSTRUCTION
    """Single-turn instruction for code tasks ({prompt}, {entry_point}); keep it equal to eval's code_prompt."""
    math_prompt: str = MATH_INSTRUCTION
    """Single-turn instruction for math tasks ({prompt}); keep it equal to eval's math_prompt."""
    max_prompt_length: Count = 1024
    """Prompts longer than this many tokens are left out (and counted in the log)."""
    sampling: RolloutSampling = field(default_factory=rl_sampling)
    """The rollouts' sampling: group size G (``n``, completions per prompt, at least 2), temperature (above 0: the
    loss's log-probs are taken at it), top-p, top-k, most tokens per completion (``max_new_tokens``, also Dr.GRPO's
    constant normaliser) and stop strings (multi-turn turns only); seeded by train.seed."""
    mask_truncated_completions: bool = False
    """Leave completions that hit sampling.max_new_tokens out of the loss."""
    prompts_per_step: Count = 1
    """Prompts per optimiser step (per process); the step trains on prompts_per_step * G completions."""
    train: TrainConfig = field(default_factory=rl_train)
    """Optimisation and bookkeeping, the keys MoL's ``train`` block shares: learning rate, schedule, steps,
    micro-batch, seed, logging and checkpoints (RL runs max_steps steps of prompts_per_step * sampling.n completions,
    accumulated in micro-batches)."""
    beta: Weight = 0.0
    """KL coefficient; > 0 loads the reference chosen by model.reference."""
    epsilon: Positive = 0.2
    """PPO clipping range of the probability ratio."""
    num_iterations: Count = 1
    """Optimisation passes over each generated batch (mu in the GRPO paper)."""
    engine: EngineName = "auto"
    """Rollout generation: auto (vLLM when installed, on a GPU, the base is a model directory and the run's tokens pay
    for the engine's start; transformers for PROPS and merged generation), vllm (in the trainer's process),
    vllm_server (the servers of engine_servers) or transformers; one choice rule decides (``molrl.engines.choice``)."""
    engine_servers: list[str] = field(default_factory=list)
    """With engine=vllm_server: the vLLM servers rollouts are generated on (http://HOST:PORT each, as molrl serve
    prints), all started on the policy's base model."""
    engine_sync_dir: str | None = None
    """With engine=vllm_server: the folder the adapter is saved in after each optimiser step for the servers to load,
    a path every server reads (a shared filesystem on a cluster); none: engine_sync under output_dir."""
    engine_gpu_memory_utilization: Annotated[float, Range(0, 1, low_open=True)] = 0.3
    """Share of each GPU the colocated engine may take (the KV cache's share of memory on a CPU is
    VLLM_CPU_KVCACHE_SPACE GiB, default 1)."""
    completion_logps: bool = False
    """completions.jsonl: each row also records its token ids (``token_ids``) with the trainer's log-prob of each
    (``trainer_logps``) and the engine's (``engine_logps``; null where the engine did not sample it), both at the
    sampling temperature; off by default for size."""
    threads: Threads | None = None
    """Torch CPU threads; none: as many as cores are idle, re-measured while it runs (molrl.cpu)."""

    # The training keys moved under train, where MoL keeps them, and the task file from train to data
    # (first, so that the old train section is free for the new one).
    RENAMED_KEYS: ClassVar[dict[str, tuple[str, Callable[[Any], Any]]]] = {
        **{f"train.{key}": (f"data.{key}", _as_is) for key in ("path", "format", "limit", "spec", "split")},
        **{key: (f"train.{key}", _as_is) for key in ("learning_rate", "lr_scheduler", "warmup_steps", "weight_decay",
                                                     "max_grad_norm", "max_steps", "micro_batch_size", "seed",
                                                     "gradient_checkpointing", "save_steps", "report_to")},
        "log_every": ("train.logging_steps", _as_is),
        "use_vllm": ("engine", lambda v: "vllm" if v in (True, "true", "True", 1) else "transformers"),
        "vllm_gpu_memory_utilization": ("engine_gpu_memory_utilization", _as_is),
        "vllm_mode": ("engine_mode", _as_is), "vllm_server_url": ("engine_server_url", _as_is),
        "eval.tasks": ("eval.data", _as_is), "eval.max_new_tokens": ("eval.sampling.max_new_tokens", _as_is),
        "terms.feedback_ce": ("loss.ce_weight", _as_is), "terms.decision_kl": ("loss.kl_weight", _as_is),
        "policy.base": ("model.path", _as_is), "policy.mol_adapter": ("model.adapter", _as_is),
        "policy.dtype": ("model.dtype", _as_is), "policy.seed": ("model.seed", _as_is),
        "policy.adapter_mode": ("model.adapter_mode", _as_is), "policy.reference": ("model.reference", _as_is),
        "reward.sandbox_workers": ("sandbox.workers", _as_is), "reward.timeout_s": ("sandbox.timeout_s", _as_is),
        "num_generations": ("sampling.n", _as_is), "temperature": ("sampling.temperature", _as_is),
        "top_p": ("sampling.top_p", _as_is), "max_completion_length": ("sampling.max_new_tokens", _as_is),
        "rollout.episode.sampling.max_new_tokens": ("episode.turn_tokens", _as_is),
        "rollout.episode.sampling.stop": ("sampling.stop", _as_is), "enable_thinking": ("thinking", _as_is),
        # the episode block is episode in every stage, most turns its max_turns (after the keys that leave it above)
        "rollout.episode": ("episode", _as_is), "rollout.turns": ("episode.max_turns", _as_is),
        "rollout.turn_tokens": ("episode.turn_tokens", _as_is),
    }
    JOINED_KEYS: ClassVar[tuple[Joined, ...]] = (Joined(("engine_mode", "engine_server_url"), _server_tier),)
    RETIRED_KEYS: ClassVar[dict[str, str | Retired]] = {
        **{f"rollout.episode.sampling.{key}": f"multi-turn rollouts sample with sampling.{key}"
           for key in ("n", "temperature", "top_p", "top_k")},
        "rollout.episode.sampling.seed": "rollouts are seeded by train.seed",
        "rollout.episode.seed": "rollouts are seeded by train.seed",
        "rollout.episode.enable_thinking": "multi-turn rollouts render with the stage's thinking",
        "rollout.episode.max_turns": "most turns is episode.max_turns",
        "rollout.episode.max_total_tokens": "a multi-turn completion's tokens, feedback included, are "
                                            "sampling.max_new_tokens",
        "rollout.episode.batch_size": "a step's episodes advance together",
        # MoL's keys, which an rl run saved before the train and lora blocks split holds at the one value rl took
        "lora.enabled": Retired("the RL stage trains a LoRA adapter; full fine-tuning is MoL's", (True,)),
        "train.epochs": Retired("the RL stage runs train.max_steps optimiser steps; epochs are MoL's", (1.0,)),
        "train.grad_accumulation": Retired("the RL stage accumulates prompts_per_step * sampling.n / "
                                           "train.micro_batch_size micro-batches a step", (None,)),
        # a completion whose scoring failed is no verdict: it has no reward, and is left out of the loss
        "reward.failure_reward": Retired("a completion whose scoring failed (a sandbox or grader error) has no "
                                         "reward: it is left out of the loss", (0.0,))}

    def __post_init__(self) -> None:
        self.model = as_model_source(self.model, RlModelSource)
        self.data, self.eval.data = self.data.resolved(), self.eval.data.resolved()
        per_step, micro = self.prompts_per_step * self.sampling.n, self.train.micro_batch_size
        if micro < 1 or per_step % micro:
            raise ValueError(f"train.micro_batch_size={micro} must divide prompts_per_step * sampling.n = {per_step}")
        if self.algorithm not in ENTRIES:
            raise ValueError(f"algorithm={self.algorithm!r}; expected one of {', '.join(ENTRIES)}")
        if self.algorithm == "opd" and self.beta != 0.0:
            raise ValueError(f"algorithm=opd with beta={self.beta}: the KL to opd.reference is already in opd's "
                             "advantage; set beta=0")
        rule = self.macro.rule
        if rule not in ("token", "randomized", "ppl", "parsing", "turn") and not (
                rule.startswith("fixed:") and rule[6:].isdigit() and int(rule[6:]) >= 1):
            raise ValueError(f"macro.rule={rule!r}; expected token, fixed:N (N >= 1), randomized, ppl, parsing or turn")
        ro = self.rollout
        if ro.partial and ro.over_provision < 1.0:
            raise ValueError(f"rollout.over_provision={ro.over_provision}: start at least as many groups as a step "
                             "trains on (1.0 = no over-provisioning; the APRIL authors use about 2)")
        rounds, buffer = ro.resolved_rounds(), ro.resolved_buffer()
        if rounds < 1 or self.sampling.n % rounds:
            raise ValueError(f"rollout.rounds={rounds} must divide sampling.n={self.sampling.n}")
        if buffer < 1:
            raise ValueError(f"rollout.buffer_batches={buffer}: must be 1 or more")
        if buffer > 1 and not ENTRIES[self.algorithm].from_rewards:
            raise ValueError(f"rollout.buffer_batches={buffer} with algorithm={self.algorithm}: its advantages depend on "
                             f"the policy, so buffered batches would train on stale ones; use {' or '.join(from_rewards())}")
        if ro.partial and (buffer > 1 or rounds > 1 or ro.behaviour != "policy"):
            raise ValueError("rollout.partial cannot be combined with rollout.behaviour=props, rounds > 1 or "
                             "buffer_batches > 1: each completion is trained on once, when its group finishes")
        check_choice("rl", self)  # the engine can honour every rollout setting (molrl.engines.choice)
        self._check_turns()
        self._check_overlap()
        pp = self.ppo
        if pp.critic_epochs < 1 or pp.critic_minibatches < 1 or pp.critic_warmup_steps < 0:
            raise ValueError("ppo: critic_epochs >= 1, critic_minibatches >= 1 and critic_warmup_steps >= 0")
        if pp.critic_learning_rate is not None and pp.critic_learning_rate <= 0:
            raise ValueError(f"ppo.critic_learning_rate={pp.critic_learning_rate}: must be > 0 (or none: the policy's)")
        pr = self.props
        if pr.update_epochs < 0 or pr.minibatches < 1 or pr.copy_every < 1 or pr.clip <= 0 or pr.target_kl <= 0 \
                or pr.min_entropy < 0:
            raise ValueError("props: update_epochs >= 0, minibatches >= 1, copy_every >= 1, clip > 0, target_kl > 0 "
                             "and min_entropy >= 0")
        if self.opd.lam <= 0:
            raise ValueError(f"opd.lam={self.opd.lam}: must be > 0 (1 is standard on-policy distillation, above 1 "
                             "extrapolates past the teacher; 0 or below would distil away from it)")
        if (self.algorithm == "opd" and self.opd.teacher == "model" and self.opd.teacher_weights == "frozen"
                and self.opd.teacher_model is None):
            raise ValueError("opd.teacher=model needs opd.teacher_model (an adapter or model directory), "
                             "or opd.teacher_weights=current")
        check_idle(self, "rl")  # last: a key set where it cannot act (molrl.config.idle)

    def _check_overlap(self) -> None:
        ro = self.rollout
        if ro.max_staleness == 0:
            return
        others = {"rollout.partial=true": ro.partial, "episode.max_turns > 1": self.episode.max_turns > 1,
                  "rollout.behaviour=props": ro.behaviour == "props", "rollout.rounds > 1": ro.resolved_rounds() > 1,
                  "rollout.buffer_batches > 1": ro.resolved_buffer() > 1, "num_iterations > 1": self.num_iterations > 1}
        clash = [name for name, on in others.items() if on]
        if clash:
            raise ValueError(f"rollout.max_staleness=1 with {', '.join(clash)}: the overlap generates each step's "
                             "single-turn groups whole, one step ahead, trained on once; set rollout.max_staleness=0")

    def _check_turns(self) -> None:
        ro, ep = self.rollout, self.episode
        combined = ro.partial or ro.behaviour != "policy" or ro.resolved_rounds() > 1
        if ep.max_turns < 1 or (ep.max_turns > 1 and combined):
            raise ValueError(f"episode.max_turns={ep.max_turns}: 1 or more; above 1 it samples whole episodes, so "
                             "not with rollout.partial, rollout.behaviour=props or rollout.rounds > 1")
        if ep.max_turns > 1 and ep.turn_tokens >= self.sampling.max_new_tokens:  # named once, not refused
            _name_once(f"episode.max_turns={ep.max_turns} with episode.turn_tokens={ep.turn_tokens} and "
                       f"sampling.max_new_tokens={self.sampling.max_new_tokens}: episode.turn_tokens never cuts a "
                       "turn, and a first turn that takes every token leaves no room for feedback and a second "
                       "turn; set episode.turn_tokens below sampling.max_new_tokens, with room for the feedback")
        if ep.max_turns > 1 and self.algorithm == "opd":
            raise ValueError("episode.max_turns > 1 with algorithm=opd: its teacher reads single-turn completions; "
                             "use grpo")


seal(RlConfig)  # an attribute it does not have is refused (molrl.config.strict)
