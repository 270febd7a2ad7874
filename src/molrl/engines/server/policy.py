"""Rollouts on a tier of vLLM servers (``engine: vllm_server``, ``engine_servers: [URL, ...]``).

The servers are vLLM's own (``molrl serve``), started by the user on the policy's base; molrl checks each holds that
base (``/v1/models``) and refuses otherwise, naming both. For ``model.adapter_mode=merge_new`` the base is the MoL
adapter merged into the model, once, under ``engine_sync_dir``: the run says in one line that the servers must be
started on that folder. Adapter-only sync (``molrl.engines.server.sync``): before the first generation after every
optimiser step the main process saves the trainer's adapter under ``engine_sync_dir`` with a new name and loads it on
every server; the others wait until the servers list it; the previous one is unloaded once no request uses it.

The same seam as the in-process engine (``molrl.engines.policy.PolicyEngine``): token ids in, the sampled ids with the
engine's log-prob of each at the sampling temperature out (the servers run with ``processed_logprobs``), so every
rollout kind (single-turn, multi-turn, partial) and the mismatch gate read them alike. One request per row, each with
its own seed; a partial rollout's rows are cancelled once enough groups finished and keep the tokens they had. Every
reply is checked by the client where it arrives (``molrl.engines.server.client.check_chunk``): a server that sends ids
outside the model's vocabulary, log-probs that are not finite, or more tokens than asked is taken out of the pool and its
requests resent; none of what it sent reaches a rollout.
"""

from __future__ import annotations

import json
import logging
import secrets
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Sequence

from molrl.engines.policy import PolicyEngine, PolicySpec, Sampled
from molrl.engines.server.client import Reply, RequestParams
from molrl.engines.server.generator import ServerGenerator, params_with_seed, row_seed
from molrl.engines.server.pool import ServerPool
from molrl.engines.server.sync import AdapterSync, check_base
from molrl.errors import MolrlError

log = logging.getLogger(__name__)


def served_base(spec: PolicySpec, folder: Path, main: bool) -> str:
    """The model the servers must hold: the base, or for merge_new the MoL adapter merged into it under ``folder``
    (merged once, by the main process; said in one line)."""
    if not spec.merged_base or spec.adapter is None:
        return spec.model
    base, adapter = (folder / "merged_base").resolve(), spec.adapter
    made_from = merged_from(spec.model, adapter)
    if main and not (base / "config.json").is_file():
        from molrl.engines.adapters import merge_adapter_copy
        from molrl.records.writes import write_folder, write_text

        with write_folder(base) as tmp:
            merge_adapter_copy(spec.model, str(adapter), str(tmp))
            write_text(tmp / MERGED_FROM, json.dumps(made_from, indent=1) + "\n")
    elif main:
        check_merged_from(base, made_from)
    log.info("model.adapter_mode=merge_new: the engine servers must serve the merged base %s (molrl serve --model "
             "%s)", base, base)
    return str(base)


MERGED_FROM = "merged_from.json"
"""The file in ``engine_sync_dir/merged_base`` saying which model and adapter were merged into it."""


def merged_from(model: str, adapter: Path) -> dict[str, str]:
    """What a merged base is made from: the model as given and the adapter's folder with its contents' fingerprint."""
    from molrl.records.fingerprint import fingerprint

    given = Path(model).expanduser()
    return {"model": str(given.resolve()) if given.exists() else model, "adapter": str(adapter),
            "adapter_fingerprint": fingerprint(adapter)}


def check_merged_from(base: Path, made_from: dict[str, str]) -> None:
    """Refuse, in one line, a merged base another run left in a shared ``engine_sync_dir``, merged from another model
    or adapter than ``made_from`` (a merged base written before ``MERGED_FROM`` existed is taken as it is)."""
    try:
        kept = json.loads((base / MERGED_FROM).read_text())
    except (OSError, ValueError):
        return
    if not isinstance(kept, dict) or (kept.get("model"), kept.get("adapter_fingerprint")) != \
            (made_from["model"], made_from["adapter_fingerprint"]):
        shown = kept.get("adapter") if isinstance(kept, dict) else None
        raise MolrlError(f"{base}: merged by another run from {shown or 'another adapter'}, not this run's "
                         f"{made_from['adapter']} on {made_from['model']}; give this run its own engine_sync_dir, or "
                         f"delete {base} to merge this run's there (then start the servers on it)")


class ServerPolicyEngine(PolicyEngine):
    """The policy on the servers of ``engine_servers``, its adapter loaded on them after every optimiser step; the
    replies' ids are checked against the model's ``vocab_size`` ids (``molrl.models.sampled_ids``)."""

    def __init__(self, spec: PolicySpec, lora_rank: int, lora_modules: Sequence[str]):
        from accelerate import PartialState

        from molrl.engines.adapters import check_policy_lora

        check_policy_lora("vllm_server", lora_rank, lora_modules)
        if spec.sync_dir is None or spec.vocab_size is None:
            raise MolrlError("engine=vllm_server needs the run's sync folder and the model's vocabulary size")
        processes = PartialState()  # the launch's processes, as the trainer's accelerator sees them
        self.spec, self.main = spec, processes.is_main_process
        self.work = spec.sync_dir
        self.pool = ServerPool(spec.servers, spec.vocab_size)
        try:
            expected = served_base(spec, self.work, self.main)
            for client in self.pool.live():
                check_base(client.url, client.models(), expected)
            tag = secrets.token_hex(4) if self.main else ""
            if processes.num_processes > 1:  # every process names the adapters alike
                from accelerate.utils import broadcast_object_list

                tag = broadcast_object_list([tag])[0]
        except BaseException:
            self.pool.close()
            raise
        # another process may still sample from the previous adapter when the main one loads the next
        self.adapters = AdapterSync(self.pool, self.work, tag, keep_behind=int(processes.num_processes > 1))
        self.lora: Any = None
        self.synced_step: int | None = None
        self.syncs = 0
        """How many adapters were loaded (one per optimiser step that was followed by generation)."""
        self.adapter_steps: dict[str, int] = {}
        """Each adapter loaded, by name: the optimiser step whose weights it holds (``sampled_under``)."""
        self.canary_decided = False
        """The check has judged the servers (``PolicyEngine.check``, RL's canary, through ``sample_ids``)."""
        self.requests = 0
        """Requests sent at the current step (a part of each request's seed)."""
        self.check: Any = None
        self.llm = None

    def sync(self, trainer: Any) -> None:
        """Load the trainer's adapter on the servers if an optimiser step changed it since the last load: the main
        process saves and loads it, the others wait for the servers to list it."""
        step = trainer.state.global_step
        if self.lora is not None and step == self.synced_step:
            return
        name = self.adapters.next_name()
        if self.main:
            model = trainer.accelerator.unwrap_model(trainer.model)
            self.adapters.publish(name, lambda folder: model.save_pretrained(
                str(folder), selected_adapters=[model.active_adapter]))
        else:
            self.adapters.follow(name)
        self.lora, self.synced_step, self.requests = name, step, 0
        self.adapter_steps[name] = step
        self.syncs += 1
        self.after_sync(trainer, step)

    def lora_name(self) -> str | None:
        """The name the servers serve the current adapter under (None before the first sync)."""
        return self.lora

    def sample_ids(self, prompt: list[int], tokens: int, temperature: float) -> Sampled:
        """``tokens`` ids sampled after ``prompt`` on the servers with the current adapter (no sync), at
        ``temperature`` alone, seed 0, with the servers' log-prob of each."""
        reply = self.pool.submit(self.lora, prompt, RequestParams(max_tokens=tokens, temperature=temperature, seed=0))
        out = self.pool.gather([reply])[0]
        return Sampled(out.ids, out.logps)

    def params(self, trainer: Any, max_tokens: int, stop: Sequence[str] = ()) -> RequestParams:
        """A request's sampling for the run's ``sampling``, ``max_tokens`` new tokens and ``stop`` strings (kept in the
        output); the trainer's end-of-sequence ids end a row."""
        s = self.spec
        return RequestParams(max_tokens=max_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                             stop=tuple(stop), stop_token_ids=tuple(trainer.eos_token_ids))

    def submit(self, trainer: Any, sequences: Sequence[list[int]], params: Any,
               cancel: threading.Event | None = None) -> list["Future[Reply]"]:
        """Send one request per sequence (``params``: one, or one per sequence) with the current adapter, each with
        its own seed; the futures hold the replies."""
        self.sync(trainer)
        each = params if isinstance(params, (list, tuple)) else [params] * len(sequences)
        step, rank = trainer.state.global_step, trainer.accelerator.process_index
        futures = []
        for sequence, p in zip(sequences, each):
            seed = row_seed(self.spec.seed, step, rank, self.requests)
            self.requests += 1
            futures.append(self.pool.submit(self.lora, sequence, params_with_seed(p, seed), cancel))
        return futures

    def generate(self, trainer: Any, sequences: Sequence[list[int]], params: Any) -> list[Sampled]:
        """One completion of each token sequence under ``params`` (one, or one per sequence), with the policy's
        current adapter."""
        return [Sampled(r.ids, r.logps) for r in self.pool.gather(self.submit(trainer, sequences, params))]

    def generate_partial(self, trainer: Any, sequences: Sequence[list[int]], params: Sequence[Any], tracker: Any,
                         logps: list[list[float]] | None = None) -> list[list[int]]:
        """Partial rollouts: one request per row, cancelled once ``tracker`` has enough finished groups; each row's
        new tokens (a cancelled one's: those it had), ``logps`` receiving their engine log-probs."""
        cancel = threading.Event()
        if tracker.enough:
            cancel.set()

        def finished(rows: list[int]) -> bool:
            tracker.finish(rows)
            return tracker.enough

        replies = self.pool.gather_until(self.submit(trainer, sequences, params, cancel), cancel, finished)
        if logps is not None:
            logps[:] = [r.logps for r in replies]
        return [r.ids for r in replies]

    def text_generator(self, trainer: Any) -> ServerGenerator:
        """A ``molrl.engines.generation.Generator`` on the servers with the policy's current adapter (the RL stage's
        evaluation hook generates through it)."""
        return ServerGenerator(self.pool, trainer.processing_class, lambda: self.lora,
                               before=lambda: self.sync(trainer))

    def close(self) -> None:
        """Unload this run's adapter from the servers and stop the requests' threads; the servers keep running."""
        try:
            self.adapters.close()
        finally:
            self.pool.close()
