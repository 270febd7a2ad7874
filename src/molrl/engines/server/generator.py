"""The eval and collect stages' generator on the engine servers (``molrl.engines.generation.Generator``).

Rendered prompts in (their token ids: nothing is re-tokenised on the server), texts out, decoded as the other engines'
are (``molrl.engines.generation.decode_completion``). Each of a prompt's ``n`` completions is its own request with its own
seed (``row_seed``), spread over the servers by the pool. A model's adapter is loaded on every server under a name of
this generator's own, and unloaded when it closes; an adapter vLLM cannot serve as LoRA (the head or the embeddings
adapted) is refused with the fix, since a server's weights are its own: merge it (molrl export) and serve the merge.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Sequence

from molrl.engines.server.client import RequestParams
from molrl.engines.server.pool import ServerPool
from molrl.engines.server.sync import check_base
from molrl.errors import MolrlError

SEED_SPAN = 2**31
"""Seeds are drawn below this (vLLM takes a 64-bit seed; a 31-bit one is valid on every backend)."""


def row_seed(seed: int, *keys: int) -> int:
    """A request's seed from the stage's ``seed`` and the request's place (``keys``: step, process, row, ...): the same
    place always gets the same seed, and nearby places far-apart ones."""
    value = seed % SEED_SPAN
    for key in keys:
        value = (value * 1_000_003 + key + 1) % SEED_SPAN
    return value


@dataclass
class ServerGenerator:
    """Completions from the model named ``model()`` on ``pool``'s servers."""

    pool: ServerPool
    tokenizer: Any
    model: Callable[[], str]
    """The model name requests sample from (the base, or an adapter loaded on the servers), asked per batch."""
    before: Callable[[], None] = lambda: None
    """Called before each batch (the RL stage's hook sends the current adapter)."""
    on_close: list[Callable[[], None]] = field(default_factory=list)
    engine = "vllm_server"
    """The engine's name, as ``engine`` names it and as records of what made a sample keep it."""

    def generate(self, prompts: Sequence[Any], sampling: Any) -> list[list[str]]:
        """``n`` completions for each prompt, in prompt order."""
        from molrl.engines.generation import decode_completion, end_ids, prompt_ids

        self.before()
        params = RequestParams(max_tokens=sampling.max_new_tokens, temperature=sampling.temperature,
                               top_p=sampling.top_p, top_k=sampling.top_k, stop=tuple(sampling.stop),
                               stop_token_ids=tuple(sorted(end_ids(self.tokenizer))))
        model = self.model()
        futures = [self.pool.submit(model, prompt_ids(self.tokenizer, p),
                                    params_with_seed(params, row_seed(sampling.seed, i, j)))
                   for i, p in enumerate(prompts) for j in range(sampling.n)]
        replies = self.pool.gather(futures)
        n = sampling.n
        return [[decode_completion(self.tokenizer, r.ids, sampling) for r in replies[i * n:(i + 1) * n]]
                for i in range(len(prompts))]

    def close(self) -> None:
        """Unload what this generator loaded on the servers, and stop its requests' threads."""
        hooks, self.on_close = self.on_close, []
        for hook in hooks:
            hook()
        self.pool.close()


def params_with_seed(params: RequestParams, seed: int) -> RequestParams:
    """``params`` with the request's own seed."""
    return replace(params, seed=seed)


def open_generator(urls: Sequence[str], tokenizer: Any, model_path: str, adapter: str | None) -> ServerGenerator:
    """A generator on the servers at ``urls``, checked to serve ``model_path``, with ``adapter`` (a PEFT folder the
    servers can read) loaded on every one; the replies' ids are checked against the model's vocabulary."""
    from molrl.engines.adapters import adapter_shape, vllm_serves_lora
    from molrl.models import sampled_ids

    pool = ServerPool(urls, sampled_ids(tokenizer, model_path))
    bases = {check_base(c.url, c.models(), model_path) for c in pool.live()}
    base = sorted(bases)[0]
    if adapter is None:
        return ServerGenerator(pool, tokenizer, lambda: base)
    rank, modules = adapter_shape(adapter)
    if not vllm_serves_lora(rank, modules):
        pool.close()
        raise MolrlError(f"model.adapter={adapter}: adapts {', '.join(sorted(modules))} at rank {rank}, which vLLM "
                         "cannot serve as LoRA on a server; merge it (molrl export --merge --adapter ADAPTER --out "
                         "DIR), serve DIR (molrl serve --model DIR) and set model=DIR without the adapter")
    name = f"molrl-adapter-{uuid.uuid4().hex[:12]}"
    path = str(Path(adapter).resolve())
    pool.call_everywhere(f"loading adapter {name}", lambda c: c.load_adapter(name, path))
    generator = ServerGenerator(pool, tokenizer, lambda: name)
    generator.on_close.append(lambda: pool.call_everywhere(f"unloading adapter {name}",
                                                           lambda c: c.unload_adapter(name)))
    return generator


def open_server_generator(spec: Any) -> tuple[ServerGenerator, Any]:
    """``engine: vllm_server``: a generator on the servers of ``spec.servers`` with the model's adapter loaded on
    them, and the model's tokenizer (``molrl.engines.builder.GeneratorSpec``)."""
    from molrl.models import load_tokenizer

    tokenizer = load_tokenizer(spec.model)
    return open_generator(spec.servers, tokenizer, spec.model, spec.adapter), tokenizer
