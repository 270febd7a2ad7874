"""RL's policy on an engine: token ids in, the sampled ids with the engine's log-prob of each out.

The seam every RL rollout kind generates through (single-turn, multi-turn, partial, one step off): ``generate`` one
completion of each token sequence, ``generate_partial`` with groups cut once enough finished, ``sync`` the trainer's
adapter to the engine after each optimiser step, ``text_generator`` for the evaluation hook. ``PolicyEngine`` is the
in-process vLLM engine (``engine: vllm``); ``molrl.engines.server.policy.ServerPolicyEngine`` the server tier's
(``engine: vllm_server``); each engine's registry line names its own (``molrl.engines.registry``). The engine holds
the policy's base (or, for ``model.adapter_mode=merge_new``, a copy with the MoL adapter merged, removed when closed)
and the adapter being trained as LoRA, re-sent under a new id before the first generation after every optimiser step,
so it never samples from a stale policy; the adapter's tensors are a few MB to a few hundred, against the full
model's weights a full sync would copy. The engine's log-probs are taken after temperature (vLLM's
``processed_logprobs``, as the trainer's are); RL compares them with the trainer's and checks, after a sync that moved
the adapter, that the engine samples from it (``check``: RL's canary, ``molrl.rl.engine``).

What a policy engine reads of the trainer: ``state.global_step``, ``accelerator`` (``unwrap_model``,
``process_index``), ``model`` (its active PEFT adapter, saved to sync), ``eos_token_ids``, ``processing_class`` and
``_tokenize_prompts`` (TRL's ``GRPOTrainer``). Nothing here imports torch or vLLM at module level.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.errors import MolrlError


@dataclass(frozen=True)
class PolicySpec:
    """What a policy engine needs of an RL run's config."""

    model: str
    """The policy's base model."""
    adapter: Path | None
    """The MoL adapter folder the run starts from (resolved), or None."""
    merged_base: bool
    """The engine's base is the model with ``adapter`` merged (``model.adapter_mode=merge_new``)."""
    dtype: str
    """The weights' dtype."""
    seed: int
    """The run's seed (the engine's own, and each server request's first part)."""
    temperature: float
    """The sampling temperature (the trainer's log-probs are taken at it too)."""
    top_p: float
    top_k: int
    max_new_tokens: int
    """Most tokens of a completion."""
    max_model_len: int
    """Longest prompt plus completion."""
    gpu_memory_utilization: float = 0.3
    """The in-process engine's share of each GPU."""
    servers: tuple[str, ...] = ()
    """The server tier's URLs."""
    sync_dir: Path | None = None
    """Where adapters (and a merged base) are saved for the servers to load."""
    vocab_size: int | None = None
    """The ids a server's reply may hold (the model's sampled vocabulary)."""


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

    def __init__(self, spec: PolicySpec, lora_rank: int, lora_modules: Sequence[str]):
        from molrl.engines.adapters import check_policy_lora, merge_adapter_copy
        from molrl.engines.local_vllm import start_llm

        check_policy_lora("vllm", lora_rank, lora_modules)
        self.spec = spec
        self.work = Path(tempfile.mkdtemp(prefix="molrl-engine-"))
        model_path = spec.model
        if spec.merged_base:  # the engine's base is the merged MoL model
            model_path = str(self.work / "base")
            merge_adapter_copy(spec.model, str(spec.adapter), model_path)
        self.llm = start_llm(model_path, dtype=spec.dtype, seed=spec.seed, lora_rank=lora_rank,
                             gpu_memory_utilization=spec.gpu_memory_utilization, max_model_len=spec.max_model_len,
                             logprobs_mode="processed_logprobs")
        self.check: Callable[[Any, Any, int], None] | None = None
        """The check after a sync that moved the adapter, until it decides (RL's canary: ``molrl.rl.engine``)."""
        self.lora: Any = None
        self.synced_step: int | None = None
        self.syncs = 0
        """How many times the adapter was sent (one per optimiser step that was followed by generation)."""
        self.canary_decided = False
        """The canary has judged the engine (it checks at each sync after an optimiser step until it can)."""
        self.adapter_steps: dict[str, int] = {}
        """Each adapter sent, by name: the optimiser step whose weights it holds (``sampled_under``)."""

    def lora_name(self) -> str | None:
        """The name the engine samples the current adapter under (None before the first sync)."""
        return None if self.lora is None else self.lora.lora_name

    def sampled_under(self, adapter: str | None = None) -> dict[str, Any]:
        """What a ``completions.jsonl`` row records of the adapter that sampled it: its name on the engine
        (``engine_adapter``; default the current one) and the optimiser step whose weights it holds
        (``engine_adapter_step``: 0 is the weights training started from)."""
        name = self.lora_name() if adapter is None else adapter
        return {"engine_adapter": name, "engine_adapter_step": self.adapter_steps.get(name) if name else None}

    def sync(self, trainer: Any) -> None:
        """Send the trainer's adapter to the engine if an optimiser step changed it since the last send; after an
        optimiser step, until it can judge, ``check`` (RL's canary) checks the engine samples with it."""
        step = trainer.state.global_step
        if self.lora is not None and step == self.synced_step:
            return
        model = trainer.accelerator.unwrap_model(trainer.model)
        self.syncs += 1
        folder = self.work / f"adapter-{self.syncs}"
        model.save_pretrained(str(folder), selected_adapters=[model.active_adapter])  # each process: its own engine
        self.send(folder)
        self.synced_step = step
        self.adapter_steps[self.lora.lora_name] = step
        self.after_sync(trainer, step)

    def after_sync(self, trainer: Any, step: int) -> None:
        """Run ``check`` after a sync that an optimiser step made, until it has decided (``canary_decided``)."""
        if step > 0 and not self.canary_decided and self.check is not None:
            self.check(self, trainer, step)

    def send(self, folder: Path) -> None:
        """Hand the adapter saved in ``folder`` to the engine under a new LoRA name and id."""
        from vllm.lora.request import LoRARequest

        previous, self.lora = self.lora, LoRARequest(f"policy-{self.syncs}", self.syncs, str(folder))
        if previous is not None:  # one adapter at a time: the old one is dropped from the engine and the disk
            self.llm.llm_engine.remove_lora(previous.lora_int_id)
            shutil.rmtree(previous.lora_path, ignore_errors=True)

    def sample_ids(self, prompt: list[int], tokens: int, temperature: float) -> Sampled:
        """``tokens`` ids sampled after ``prompt`` with the adapter the engine holds now (no sync), at ``temperature``
        alone (no top-p / top-k: the trainer's log-probs have none), seed 0, with the engine's log-prob of each."""
        from vllm import SamplingParams

        params = SamplingParams(n=1, temperature=temperature, max_tokens=tokens, logprobs=0, seed=0, detokenize=False)
        return sampled_of(self.llm.generate([{"prompt_token_ids": prompt}], params, lora_request=self.lora,
                                            use_tqdm=False)[0].outputs[0])

    def params(self, trainer: Any, max_tokens: int, stop: Sequence[str] = ()) -> Any:
        """vLLM sampling parameters for the run's sampling (``spec``), ``max_tokens`` new tokens, and
        ``stop`` strings (kept in the output); the trainer's end-of-sequence ids end a row."""
        from vllm import SamplingParams

        s = self.spec
        return SamplingParams(
            n=1, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k if s.top_k > 0 else -1,
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
        finished groups (``engine_generate``); each row's new tokens, ``logps`` receiving their engine log-probs."""
        self.sync(trainer)
        return engine_generate(self.llm.llm_engine, sequences, params, tracker,
                               f"molrl-{trainer.state.global_step}-{trainer.accelerator.process_index}",
                               lora_request=self.lora, logps=logps)

    def rollout(self, prompts: list[Any], trainer: Any) -> dict[str, list]:
        """TRL's ``rollout_func``: each prompt's ids (the trainer's own encoding), one completion each, and the
        engine's log-probs of it."""
        prompt_ids = trainer._tokenize_prompts(prompts)[0]
        out = self.generate(trainer, prompt_ids, self.params(trainer, self.spec.max_new_tokens))
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


def engine_generate(engine: Any, sequences: Sequence[list[int]], params: Sequence[Any], tracker: Any,
                    prefix: str, lora_request: Any = None,
                    logps: list[list[float]] | None = None) -> list[list[int]]:
    """Partial rollouts on a vLLM ``LLMEngine``: add one request per row, step the engine, and abort the
    unfinished requests once ``tracker`` (``molrl.rl.rollouts.partial_state.GroupTracker``) has enough finished
    groups. Returns each row's new tokens
    (those of an aborted request: what it had generated so far); ``tracker.done`` says which finished.

    ``params[i]`` are row i's sampling parameters (its remaining token budget as ``max_tokens``), ``lora_request``
    the adapter every request samples with; ``logps``, when given, receives each row's engine log-probs of its new
    tokens (the requests asked for ``logprobs=0``);
    outputs are read cumulatively (vLLM's default), so the latest output of a request holds all its tokens.
    """
    tokens: list[list[int]] = [[] for _ in sequences]
    if logps is not None:
        logps[:] = [[] for _ in sequences]
    names = [f"{prefix}-{i}" for i in range(len(sequences))]
    for name, sequence, param in zip(names, sequences, params):
        engine.add_request(name, {"prompt_token_ids": list(sequence)}, param, lora_request=lora_request)
    index = {name: i for i, name in enumerate(names)}
    while not tracker.enough and engine.has_unfinished_requests():
        ending = []
        for output in engine.step():
            i = index.get(output.request_id)
            if i is None:
                continue
            tokens[i] = list(output.outputs[0].token_ids)
            if logps is not None:
                logps[i] = [entry[token].logprob for token, entry in zip(tokens[i], output.outputs[0].logprobs or [])]
            if output.finished:
                ending.append(i)
        tracker.finish(ending)
    unfinished = [names[i] for i, done in enumerate(tracker.done) if not done]
    if unfinished:
        engine.abort_request(unfinished)
    return tokens
