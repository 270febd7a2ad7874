"""Rollouts on vLLM with the policy's current weights (``engine: vllm`` in the rl stage).

The engine runs in the trainer's process (``molrl.engines.generation.start_llm``) and holds the policy's base: the base
model directory, or, for ``model.adapter_mode=merge_new``, a copy with the MoL adapter merged that the engine
removes when closed. The adapter being trained is served as a vLLM LoRA adapter. Before the first generation after
every optimiser step, ``sync`` saves the trainer's adapter and hands it to the engine under a new LoRA id, so the
engine never samples from a stale policy; the adapter's tensors are a few MB to a few hundred, against the full
model's weights a full sync would copy.

Token ids in, token ids out: a request is the row's prompt ids (and, in multi-turn rollouts, its tokens so far),
and the row keeps the ids the engine sampled, with the engine's log-prob of each (after temperature: vLLM's
``processed_logprobs``, as the trainer's are). ``molrl.rl.mismatch`` compares those with the trainer's
(``rollout/mismatch_kl``, ``rollout/engine_logp_gap``, ``rollout/is_ess``, the gate ``rollout.max_mismatch_kl``): a
stale or half-synced engine shows there, and the canary at the first sync after an optimiser step stops a run whose
engine samples from the base.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.engines.choice import EngineChoice, choose
from molrl.errors import MolrlError
from molrl.rl.config import RlConfig


def rl_engine(cfg: RlConfig, *, installed: bool | None = None, gpu: bool | None = None) -> EngineChoice:
    """The engine the rl stage generates with: ``cfg.engine`` as the one choice rule (``molrl.engines.choice``)
    decides it for the run's tokens (steps x prompts x G x ``sampling.max_new_tokens``) and its rollout settings."""
    work = cfg.train.max_steps * cfg.prompts_per_step * cfg.sampling.n * cfg.sampling.max_new_tokens
    return choose("rl", cfg, work, installed=installed, gpu=gpu)


CANARY_TOKENS = 8
"""Tokens the canary samples after its fixed prompt."""


@dataclass
class Sampled:
    """One request's result."""

    ids: list[int]
    """The sampled token ids (an end-of-sequence token that ended the row included)."""
    logps: list[float]
    """The engine's log-prob of each sampled id, at the sampling temperature."""


class PolicyEngine:
    """The policy on an in-process vLLM engine, its adapter re-sent after every optimiser step (``sync``)."""

    def __init__(self, cfg: RlConfig, lora_rank: int, lora_modules: Sequence[str]):
        from molrl.engines.adapters import check_policy_lora, merge_adapter_copy
        from molrl.engines.local_vllm import start_llm

        check_policy_lora("vllm", lora_rank, lora_modules)
        m = cfg.model
        self.work = Path(tempfile.mkdtemp(prefix="molrl-engine-"))
        model_path = m.path
        if m.adapter is not None and m.adapter_mode == "merge_new":  # the engine's base is the merged MoL model
            from molrl.rl.adapter_lora import resolve_adapter_dir

            model_path = str(self.work / "base")
            merge_adapter_copy(m.path, str(resolve_adapter_dir(m.adapter)), model_path)
        self.llm = start_llm(model_path, dtype=m.dtype, seed=cfg.train.seed, lora_rank=lora_rank,
                             gpu_memory_utilization=cfg.engine_gpu_memory_utilization,
                             max_model_len=cfg.max_prompt_length + cfg.sampling.max_new_tokens,
                             logprobs_mode="processed_logprobs")
        self.lora: Any = None
        self.synced_step: int | None = None
        self.syncs = 0
        """How many times the adapter was sent (one per optimiser step that was followed by generation)."""
        self.canary_decided = False
        """The canary has judged the engine (it checks at each sync after an optimiser step until it can)."""

    def sync(self, trainer: Any) -> None:
        """Send the trainer's adapter to the engine if an optimiser step changed it since the last send; after an
        optimiser step, until it can judge, the canary checks the engine samples with it (``canary``)."""
        step = trainer.state.global_step
        if self.lora is not None and step == self.synced_step:
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.syncs += 1
        folder = self.work / f"adapter-{self.syncs}"
        model.save_pretrained(str(folder), selected_adapters=[model.active_adapter])  # each process: its own engine
        self.send(folder)
        self.synced_step = step
        if step > 0 and not self.canary_decided:
            self.canary(trainer, step)

    def send(self, folder: Path) -> None:
        """Hand the adapter saved in ``folder`` to the engine under a new LoRA name and id."""
        from vllm.lora.request import LoRARequest

        previous, self.lora = self.lora, LoRARequest(f"policy-{self.syncs}", self.syncs, str(folder))
        if previous is not None:  # one adapter at a time: the old one is dropped from the engine and the disk
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def canary(self, trainer: Any, step: int) -> None:
        """Stop the run ("engine on the base") if the engine's log-probs of a few tokens it samples after one fixed
        prompt (the first training prompt) are nearer the base's than the trained adapter's, or are not finite;
        undecided while the adapter is too near its base to tell (``molrl.rl.mismatch.canary_verdict``), it asks again
        at the next sync."""
        import torch
        from trl.trainer.utils import use_adapter

        from molrl.rl.batch import pad_rows
        from molrl.rl.mismatch import canary_message, canary_verdict

        if not trainer.prompt_ids:  # no dataset prompt to ask with
            self.canary_decided = True
            return
        prompt = list(next(iter(trainer.prompt_ids.values())))
        out = self.sample_ids(prompt, CANARY_TOKENS, trainer.logprobs.temperature)
        if not out.ids:
            return
        device = trainer.accelerator.device
        rows = (*pad_rows([prompt], trainer.processing_class.pad_token_id, "left", device),
                *pad_rows([out.ids], trainer.processing_class.pad_token_id, "right", device))
        adapter = trainer.logprobs.completion(trainer.model, *rows)[0]  # [n] under the trained adapter, at T
        with use_adapter(trainer.accelerator.unwrap_model(trainer.model), adapter_name=None):  # the adapter off
            base = trainer.logprobs.completion(trainer.model, *rows)[0]  # [n] under the engine's base, at T
        verdict = canary_verdict(torch.tensor(out.logps), adapter.float().cpu(), base.float().cpu())
        self.canary_decided = verdict.decided
        if verdict.failed:
            raise MolrlError(canary_message(step, verdict))

    def sample_ids(self, prompt: list[int], tokens: int, temperature: float) -> Sampled:
        """``tokens`` ids sampled after ``prompt`` with the adapter the engine holds now (no sync), at ``temperature``
        alone (no top-p / top-k: the trainer's log-probs have none), seed 0, with the engine's log-prob of each."""
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=temperature, max_tokens=tokens, logprobs=0, seed=0, detokenize=False)
        return sampled_of(self.llm.generate([{"prompt_token_ids": prompt}], params, lora_request=self.lora,
                                            use_tqdm=False)[0].outputs[0])

    def params(self, trainer: Any, max_tokens: int, stop: Sequence[str] = ()) -> Any:
        """vLLM sampling parameters for the run's ``sampling`` (``trainer.cfg``), ``max_tokens`` new tokens, and
        ``stop`` strings (kept in the output); the trainer's end-of-sequence ids end a row."""
        from vllm import SamplingParams

        sampling = trainer.cfg.sampling
        return SamplingParams(
            n=1, temperature=trainer.logprobs.temperature, top_p=sampling.top_p,
            top_k=sampling.top_k if sampling.top_k > 0 else -1,
            max_tokens=max_tokens, stop=list(stop) or None, include_stop_str_in_output=True,
            stop_token_ids=list(trainer.eos_token_ids), logprobs=0, detokenize=bool(stop))

    def generate(self, trainer: Any, sequences: Sequence[list[int]], params: Any) -> list[Sampled]:
        """One completion of each token sequence under ``params`` (one, or one per sequence), with the policy's
        current adapter."""
        self.sync(trainer)
        outputs = self.llm.generate([{"prompt_token_ids": list(s)} for s in sequences], params,
                                    lora_request=self.lora, use_tqdm=False)
        return [sampled_of(o.outputs[0]) for o in outputs]

    def generate_partial(self, trainer: Any, sequences: Sequence[list[int]], params: Sequence[Any], tracker: Any,
                         logps: list[list[float]] | None = None) -> list[list[int]]:
        """Partial rollouts: one request per row (``params[i]`` its sampling), aborted once ``tracker`` has enough
        finished groups (``molrl.rl.rollouts.partial_state.engine_generate``); each row's new tokens, ``logps``
        receiving their engine log-probs."""
        from molrl.rl.rollouts.partial_state import engine_generate

        self.sync(trainer)
        return engine_generate(self.llm.llm_engine, sequences, params, tracker,
                               f"molrl-{trainer.state.global_step}-{trainer.accelerator.process_index}",
                               lora_request=self.lora, logps=logps)

    def rollout(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """TRL's ``rollout_func``: each prompt's ids (the trainer's own encoding), one completion each, and the
        engine's log-probs of it."""
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        out = self.generate(trainer, prompt_ids, self.params(trainer, trainer.cfg.sampling.max_new_tokens))
        return {"prompt_ids": prompt_ids, "completion_ids": [s.ids for s in out], "logprobs": [s.logps for s in out]}

    def text_generator(self, trainer: Any) -> "PolicyGenerator":
        """A ``molrl.engines.generation.Generator`` on this engine with the policy's current adapter (the RL stage's
        evaluation hook generates through it)."""
        return PolicyGenerator(self, trainer)

    def close(self) -> None:
        """Shut the engine down (its memory given back) and remove its files (the merged base, the sent adapters)."""
        from molrl.engines.local_vllm import stop_llm

        llm, self.llm = self.llm, None
        if llm is not None:
            stop_llm(llm)
        shutil.rmtree(self.work, ignore_errors=True)


@dataclass
class PolicyGenerator:
    """Rendered prompts in, texts out, on the policy engine with the trainer's current adapter."""

    engine: PolicyEngine
    trainer: Any

    def generate(self, prompts: Sequence[Any], sampling: Any) -> list[list[str]]:
        from molrl.engines.local_vllm import vllm_generate

        self.engine.sync(self.trainer)
        return vllm_generate(self.engine.llm, self.trainer.processing_class, prompts, sampling, self.engine.lora)


def sampled_of(completion: Any) -> Sampled:
    """A vLLM ``CompletionOutput`` as ``Sampled``: its ids and the log-prob of each (from ``logprobs=0``)."""
    ids = list(completion.token_ids)
    logps = [entry[token].logprob for token, entry in zip(ids, completion.logprobs or [])]
    if len(logps) != len(ids):
        raise MolrlError(f"vLLM returned {len(logps)} log-probs for {len(ids)} sampled tokens; the engine must be "
                         "asked for logprobs=0")
    return Sampled(ids, logps)


def attach_engine(trainer: Any, cfg: RlConfig,
                  kind: Callable[[RlConfig, int, list[str]], "PolicyEngine"] | None = None) -> "PolicyEngine":
    """Start the engine ``kind`` makes from the config, the LoRA rank and its modules (``PolicyEngine``: in this
    process, the default; ``molrl.rl.server_engine``'s: a client to ``engine_servers``) for ``trainer``'s policy and
    make it the trainer's generation (TRL's ``rollout_func``)."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    peft = model.peft_config[model.active_adapter]
    targets = peft.target_modules
    engine = (kind or PolicyEngine)(cfg, int(peft.r), [targets] if isinstance(targets, str) else list(targets))
    trainer.engine, trainer.rollout_func = engine, engine.rollout
    return engine
