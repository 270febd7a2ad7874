"""The frozen base's targets at the KL's tokens, computed once and reused by every epoch, arm and seed.

The base's answer at a trace's token never changes: same weights, same tokens. ``loss.base_targets`` picks what is
kept at each KL-measured position (a decision token, or any token of a general example):

- ``hidden``: the base's final hidden state [H] in the model's dtype; the loss applies the base head to it, as the
  live path does, so the KL stays exact;
- ``topk``: the base's top K log-probs, the tail's log mass and the trace token's own log-prob
  (``molrl.mol.topk.TopK``); the loss takes the KL over those K + 1 classes.

``loss.base_targets_dir`` is a store: one cache per key, in ``<mode>-<digest of the key>/`` under it, so the arms of a
pipeline, a study or a demo, their seeds and their re-runs share it, each finding the cache of its own inputs (a
folder that itself holds a cache, with its ``key.json``, is that one cache). A cache is a folder: ``key.json`` (what it
was made from, written first), ``shard-NNNNN.pt`` (``SHARD_EXAMPLES``
examples each, by example index: ``offsets`` [n + 1] and the rows of its examples in order), and ``manifest.json``
(written last: the key, build seconds, bytes, bytes per KL token). Every file is written whole or not at all
(``molrl.records.writes``), so a build killed mid-way resumes from its last whole shard. The key (``CacheKey``) is the
content the targets depend on; a cache whose key differs in any part is refused in one line naming the parts,
never used. Rows are made by the trainer's own base forward (``MolTrainer._base_hidden``: the adapter disabled,
or the frozen copy), exactly what the live path runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import torch

from molrl.errors import MolrlError
from molrl.mol.losses import TokenMasks, _chunk_size, _linear, token_masks
from molrl.mol.topk import TopK, topk_targets
from molrl.records.writes import open_output, write_text

log = logging.getLogger(__name__)

SHARD_EXAMPLES = 256
"""Examples per shard: what a killed build loses at most."""
KEY_FILE, MANIFEST = "key.json", "manifest.json"
TOPK_FIELDS = ("indices", "logprobs", "tail", "token")


@dataclass(frozen=True)
class CacheKey:
    """What the cached targets depend on; a cache is used only when every part matches."""

    base: str
    """Fingerprint of the base's weights (``molrl.records.fingerprint``; a tiny: model by its name and seed)."""
    traces: str
    """sha256 of the tokenised examples in order: input_ids, feedback and decision masks, general tag."""
    max_length: int
    """data.max_length the traces were cut at."""
    chat_template: str
    """sha256 of the chat template that rendered the traces."""
    dtype: str
    """The base's weights dtype."""
    mode: str
    """loss.base_targets: hidden or topk."""
    k: int | None
    """loss.base_topk for topk; None for hidden."""


def traces_hash(examples: Sequence[dict[str, Any]]) -> str:
    """sha256 of the examples' tokens and masks, in order (the index column is their position)."""
    digest = hashlib.sha256()
    for ex in examples:
        record = [ex["input_ids"], ex["feedback_mask"], ex["decision_mask"], bool(ex["is_general"])]
        digest.update(json.dumps(record, separators=(",", ":")).encode())
        digest.update(b"\n")
    return digest.hexdigest()


def base_fingerprint(path: str, seed: int) -> str:
    """The base's weights by content: a folder or cached hub model's fingerprint, a tiny: model's name and seed."""
    from molrl.records.fingerprint import model_fingerprint

    found = model_fingerprint(path)
    if found is not None:
        return found["fingerprint"]
    if str(path).startswith("tiny:"):
        return f"{path}@seed={seed}"
    raise MolrlError(f"model={path}: not a folder, a file or a cached hub model, so the base targets' cache cannot "
                     "know its weights; give a local path, or set loss.base_targets=live")


def cache_key(cfg: Any, examples: Sequence[dict[str, Any]], tokenizer: Any) -> CacheKey:
    """The key of the cache ``cfg`` (a ``MolConfig``) asks for over ``examples``."""
    from molrl.models import DTYPES

    template = getattr(tokenizer, "chat_template", None) or ""
    loss = cfg.loss
    return CacheKey(base=base_fingerprint(cfg.model.path, cfg.model.seed), traces=traces_hash(examples),
                    max_length=cfg.data.max_length, chat_template=hashlib.sha256(template.encode()).hexdigest(),
                    dtype=str(DTYPES[cfg.model.dtype]).removeprefix("torch."), mode=loss.base_targets,
                    k=loss.base_topk if loss.base_targets == "topk" else None)


def key_differences(saved: dict[str, Any], key: CacheKey) -> list[str]:
    """``part was X, now Y`` for each part of ``key`` the saved key differs in (a part it lacks differs)."""
    out = []
    for f in dataclasses.fields(CacheKey):
        was, now = saved.get(f.name, "(missing)"), getattr(key, f.name)
        if was != now:
            out.append(f"{f.name} was {_short(was)}, now {_short(now)}")
    return out


def _short(value: Any) -> str:
    return f"{value[:12]}..." if isinstance(value, str) and len(value) == 64 else repr(value)


def entry_name(key: CacheKey) -> str:
    """The folder name of ``key``'s cache in a store: its mode (and K) and the first 16 hex digits of its sha256."""
    digest = hashlib.sha256(json.dumps(dataclasses.asdict(key), sort_keys=True).encode()).hexdigest()
    return f"{key.mode}{key.k or ''}-{digest[:16]}"


def cache_folder(root: Path, key: CacheKey) -> Path:
    """Where ``key``'s cache is under ``root`` (``loss.base_targets_dir``): ``root`` itself when it holds one cache,
    else the store's entry for ``key``."""
    if (root / KEY_FILE).is_file() or (root / MANIFEST).is_file():
        return root
    return root / entry_name(key)


def check_key(folder: Path, key: CacheKey) -> bool:
    """Whether ``folder`` holds a cache (whole or partly built) for ``key``: False when it holds none; refuses one
    made from anything else, in one line naming each part that differs."""
    for name in (MANIFEST, KEY_FILE):
        path = folder / name
        if not path.is_file():
            continue
        try:
            saved = json.loads(path.read_text())["key"]
        except (ValueError, KeyError, TypeError):
            raise MolrlError(f"{path}: not a base-targets manifest; delete {folder}, or set loss.base_targets_dir "
                             "to another folder") from None
        differs = key_differences(saved, key)
        if differs:
            raise MolrlError(f"{path}: the cached base targets were made from other inputs ({'; '.join(differs)}); "
                             f"never used: delete {folder} to rebuild it, or set loss.base_targets_dir to another "
                             "folder")
        return True
    return False


def measured(masks: TokenMasks) -> torch.Tensor:
    """[B, L-1] bool: the positions whose KL the loss measures (the loss's own rule, ``needs_base``)."""
    return masks.decision | masks.general


def _masks(batch: dict[str, torch.Tensor]) -> TokenMasks:
    return token_masks(batch["input_ids"], batch["feedback_mask"], batch["decision_mask"], batch["attention_mask"],
                       batch["is_general"])


@torch.no_grad()
def base_rows(trainer: Any, batch: dict[str, torch.Tensor], mode: str, k: int | None) -> list[dict[str, torch.Tensor]]:
    """Per example of ``batch``: the base's targets at its KL-measured positions, in order (``hidden`` [n, H], or
    the ``TopK`` fields [n, K] / [n]), from the trainer's own base forward."""
    from molrl.mol.trainer import _causal_lm, _head_tensors

    base_hidden = trainer._base_hidden(trainer.model, batch)  # [B, L, H]
    masks = _masks(batch)
    kl_measured = measured(masks)  # [B, L-1]
    out = []
    if mode == "topk":
        base_lm = trainer.ref_model if trainer.ref_model is not None else _causal_lm(trainer.model)
        weight, bias = _head_tensors(base_lm, adapter=False)
        if k >= weight.shape[0]:
            raise MolrlError(f"loss.base_topk={k}: the vocabulary has {weight.shape[0]} tokens; keep fewer (the "
                             "tail is the rest), or use loss.base_targets=hidden")
        chunk = _chunk_size(trainer.loss_settings.chunk_size, weight.shape[0])
    for b in range(base_hidden.shape[0]):
        t = kl_measured[b].nonzero().squeeze(1)  # [n] positions; position t predicts token t + 1
        h = base_hidden[b].index_select(0, t)  # [n, H]
        if mode == "hidden":
            out.append({"hidden": h.cpu()})
            continue
        targets = masks.targets[b].index_select(0, t)  # [n]
        parts = [topk_targets(_linear(h[s:s + chunk], weight, bias), targets[s:s + chunk], k)
                 for s in range(0, max(1, h.shape[0]), chunk)]
        out.append({name: torch.cat([getattr(p, name) for p in parts]).cpu() for name in TOPK_FIELDS})
    return out


def build(folder: Path, key: CacheKey, trainer: Any, examples: Sequence[dict[str, Any]], batch_size: int,
          pad_token_id: int, shard_examples: int = SHARD_EXAMPLES) -> dict[str, Any]:
    """Build the missing shards of the cache for ``key`` in ``folder`` and write its manifest; returns the manifest.
    A rank of a data-parallel launch builds its share of the shards first, then any still missing."""
    from molrl.mol.data import MolCollator

    folder.mkdir(parents=True, exist_ok=True)
    if not (folder / KEY_FILE).is_file():
        write_text(folder / KEY_FILE, json.dumps({"key": dataclasses.asdict(key)}, indent=2))
    collate = MolCollator(pad_token_id)
    n_shards = max(1, -(-len(examples) // shard_examples))
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    order = [i for i in range(n_shards) if i % world == rank] + [i for i in range(n_shards) if i % world != rank]
    model = trainer.model
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    start, built = time.perf_counter(), 0
    try:
        for i in order:
            path = folder / f"shard-{i:05d}.pt"
            if path.is_file():
                continue
            chunk = examples[i * shard_examples: (i + 1) * shard_examples]
            rows: list[dict[str, torch.Tensor]] = []
            for s in range(0, len(chunk), batch_size):
                batch = {name: v.to(device) for name, v in collate(chunk[s:s + batch_size]).items()}
                rows += base_rows(trainer, batch, key.mode, key.k)
            lengths = torch.tensor([0] + [next(iter(r.values())).shape[0] for r in rows])
            payload = {"offsets": lengths.cumsum(0)}
            payload.update({name: torch.cat([r[name] for r in rows]) for name in rows[0]})
            with open_output(path) as handle:
                torch.save(payload, handle)
            built += 1
    finally:
        model.train(was_training)
    seconds = time.perf_counter() - start
    return _write_manifest(folder, key, n_shards, shard_examples, len(examples), seconds, n_shards - built)


def _write_manifest(folder: Path, key: CacheKey, n_shards: int, shard_examples: int, n_examples: int,
                    seconds: float, resumed: int) -> dict[str, Any]:
    shards = [folder / f"shard-{i:05d}.pt" for i in range(n_shards)]
    tokens, covered = 0, 0.0
    for path in shards:
        payload = torch.load(path, mmap=True, weights_only=True)
        tokens += int(payload["offsets"][-1])
        if "tail" in payload:
            covered += float((1.0 - payload["tail"].float().exp()).sum())
    size = sum(p.stat().st_size for p in shards)
    manifest = {"key": dataclasses.asdict(key), "examples": n_examples, "shards": n_shards,
                "shard_examples": shard_examples, "kl_tokens": tokens, "build_seconds": round(seconds, 3),
                "shards_resumed": resumed, "bytes": size, "bytes_per_kl_token": size / max(tokens, 1)}
    if key.mode == "topk":
        manifest["covered_mass"] = covered / max(tokens, 1)
    write_text(folder / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


class BaseTargetsCache:
    """A built cache, read shard by shard (memory-mapped) as the trainer asks for its examples' rows."""

    def __init__(self, folder: Path, manifest: dict[str, Any]):
        self.folder = Path(folder)
        self.manifest = manifest
        self.mode = manifest["key"]["mode"]
        self._shards: dict[int, dict[str, torch.Tensor]] = {}

    def _shard(self, i: int) -> dict[str, torch.Tensor]:
        if i not in self._shards:
            self._shards[i] = torch.load(self.folder / f"shard-{i:05d}.pt", mmap=True, weights_only=True)
        return self._shards[i]

    def rows(self, indices: Sequence[int]) -> dict[str, torch.Tensor]:
        """The cached rows of the examples ``indices``, concatenated in that order, per field."""
        per = self.manifest["shard_examples"]
        parts: dict[str, list[torch.Tensor]] = {}
        for index in indices:
            shard = self._shard(index // per)
            offsets = shard["offsets"]
            lo, hi = int(offsets[index % per]), int(offsets[index % per + 1])
            for name, value in shard.items():
                if name != "offsets":
                    parts.setdefault(name, []).append(value[lo:hi])
        return {name: torch.cat(values) for name, values in parts.items()}

    def batch_targets(self, inputs: dict[str, torch.Tensor], masks: TokenMasks, dtype: torch.dtype
                      ) -> tuple[torch.Tensor | None, TopK | None]:
        """The micro-batch's base targets as ``mol_loss`` takes them: hidden states [B, L, H] (set at the
        KL-measured positions, zero elsewhere) or the top K at its KL rows."""
        if "index" not in inputs:
            raise MolrlError("loss.base_targets needs each example's index column (molrl.mol.data.load_examples "
                             "adds it); give examples with an 'index' field, or set loss.base_targets=live")
        kl_measured = measured(masks)  # [B, L-1]
        rows = self.rows(inputs["index"].tolist())
        n = next(iter(rows.values())).shape[0]
        if n != int(kl_measured.sum()):
            raise MolrlError(f"{self.folder}: the cached base targets hold {n} positions for this batch, its traces "
                             f"{int(kl_measured.sum())}; delete {self.folder} to rebuild it")
        device = masks.targets.device
        if self.mode == "topk":
            return None, TopK(**{name: rows[name].to(device) for name in TOPK_FIELDS})
        B, L = inputs["input_ids"].shape
        kl_rows = kl_measured.flatten().nonzero().squeeze(1)  # [N_kl] flat into [B*(L-1)]
        hidden = torch.zeros(B * L, rows["hidden"].shape[1], dtype=dtype, device=device)  # [B*L, H]
        hidden[kl_rows + kl_rows // (L - 1)] = rows["hidden"].to(device=device, dtype=dtype)
        return hidden.view(B, L, -1), None


def prepare(cfg: Any, examples: Sequence[dict[str, Any]], tokenizer: Any, trainer: Any,
            shard_examples: int = SHARD_EXAMPLES) -> BaseTargetsCache:
    """The cache ``cfg.loss`` asks for: used as it is when whole and made from the same inputs, resumed when partly
    built, built when missing (with the trainer's model, before it trains); refused when made from other inputs."""
    root = Path(cfg.loss.base_targets_dir or Path(cfg.output_dir) / "base_targets")
    for i, ex in enumerate(examples):  # the cache's rows are by position: the index column must be it
        if ex.setdefault("index", i) != i:
            raise MolrlError(f"example {i} has index {ex['index']}; the base targets' cache finds an example's rows "
                             "by its position among the run's examples")
    key = cache_key(cfg, examples, tokenizer)
    folder = cache_folder(root, key)
    found = check_key(folder, key)
    if found and (folder / MANIFEST).is_file():
        manifest = json.loads((folder / MANIFEST).read_text())
        log.info("base targets (%s): reusing %s, %d KL tokens, %.1f MB", key.mode, folder, manifest["kl_tokens"],
                 manifest["bytes"] / 1e6)
    else:
        log.info("base targets (%s): %s %s", key.mode, "resuming the build of" if found else "building", folder)
        manifest = build(folder, key, trainer, examples, cfg.train.micro_batch_size, tokenizer.pad_token_id,
                         shard_examples)
        log.info("base targets (%s): built %s in %.1f s, %d KL tokens, %.1f bytes per KL token", key.mode, folder,
                 manifest["build_seconds"], manifest["kl_tokens"], manifest["bytes_per_kl_token"])
    if "covered_mass" in manifest:
        log.info("base targets (topk): the base's top %d tokens hold %.4f of its mass on average", key.k,
                 manifest["covered_mass"])
    return BaseTargetsCache(folder, manifest)
