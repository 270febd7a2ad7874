"""The frozen base's targets cached once (``molrl.mol.base_cache``): exact for hidden, the coarse KL for topk, keyed by
content, resumable, reused by a resumed run and checked against the live base while used."""

from __future__ import annotations

import dataclasses
import json
import logging
import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from molrl.config import ConfigError, load_config
from molrl.errors import MolrlError
from molrl.mol import base_cache
from molrl.mol.base_cache import CacheKey, cache_key, check_key, prepare
from molrl.mol.config import LossSettings, MolConfig
from molrl.mol.losses import mol_loss, step_counts, token_masks
from molrl.mol.run import build_trainer, check_config, run_mol
from molrl.mol.topk import normalised, topk_targets

from test_mol_trainer import make_cfg, synthetic_examples

REPO = Path(__file__).resolve().parents[1]


def _trainer(tmp_path, mode="hidden", **loss):
    """A tiny LoRA trainer whose adapter is moved off zero (so the policy is not the base) and its examples."""
    from molrl.tiny import build_tiny_tokenizer

    cfg = make_cfg(tmp_path, micro_batch_size=3, grad_accumulation=1, max_steps=1)
    cfg.loss = dataclasses.replace(cfg.loss, base_targets=mode, **loss)
    examples = synthetic_examples()
    tokenizer = build_tiny_tokenizer("chatml")
    trainer = build_trainer(cfg, examples, tokenizer)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in trainer.model.named_parameters():
            if "lora_B" in name:
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
    return cfg, examples, tokenizer, trainer


def _loss_and_grads(trainer, batch):
    trainer.model.zero_grad(set_to_none=True)
    loss = trainer.compute_loss(trainer.model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in trainer.model.named_parameters() if p.requires_grad}
    return loss.item(), grads


def test_hidden_cache_gives_the_live_loss_and_gradients(tmp_path):
    from molrl.mol.data import MolCollator

    cfg, examples, tokenizer, trainer = _trainer(tmp_path)
    cache = prepare(cfg, examples, tokenizer, trainer, shard_examples=3)
    batch = MolCollator(tokenizer.pad_token_id)([examples[i] for i in (5, 0, 3, 7)])  # not the build's batches
    live_loss, live_grads = _loss_and_grads(trainer, batch)
    trainer.base_targets = cache
    cached_loss, cached_grads = _loss_and_grads(trainer, batch)
    assert live_loss > 0.05  # the adapter moved the policy: a real KL, not 0 = 0
    assert cached_loss == pytest.approx(live_loss, rel=1e-5)
    for name, grad in live_grads.items():
        torch.testing.assert_close(cached_grads[name], grad, rtol=1e-4, atol=1e-7)


def _coarse_reference(hidden, weight, topk, masks, settings):
    """CE on feedback + the K + 1 class KL on decision and general tokens, from full logits, by autograd."""
    logp = torch.log_softmax((hidden @ weight.t())[:, :-1].float(), -1)  # [B, L-1, V]
    ce = -logp.gather(-1, masks.targets[..., None]).squeeze(-1)  # [B, L-1]
    kl_mask = masks.decision | masks.general
    lp = logp[kl_mask]  # [N_kl, V] row-major, as the loss orders its KL rows
    idx = topk.indices.long()
    logp_k = lp.gather(1, idx)  # [N_kl, K]
    logp_tail = torch.logsumexp(lp.scatter(1, idx, float("-inf")), -1)  # [N_kl]
    logq_k, logq_tail = normalised(topk.logprobs, topk.tail)
    if settings.kl_direction == "forward":
        kl = (logq_k.exp() * (logq_k - logp_k)).sum(-1) + logq_tail.exp() * (logq_tail - logp_tail)
    else:
        kl = (logp_k.exp() * (logp_k - logq_k)).sum(-1) + logp_tail.exp() * (logp_tail - logq_tail)
    return (settings.ce_weight * ce[masks.feedback].sum() / masks.feedback.sum()
            + settings.kl_weight * kl.sum() / kl_mask.sum())


@pytest.mark.parametrize("direction", ["reverse", "forward"])
def test_topk_loss_and_gradient_equal_the_coarse_kl_reference(direction):
    g = torch.Generator().manual_seed(3)
    B, L, H, V, K = 3, 12, 8, 40, 6
    ids = torch.randint(0, V, (B, L), generator=g)
    feedback = torch.rand(B, L, generator=g) < 0.4
    decision = ~feedback & (torch.rand(B, L, generator=g) < 0.6)
    masks = token_masks(ids, feedback, decision, torch.ones(B, L), torch.tensor([False, True, False]))
    hidden = torch.randn(B, L, H, generator=g, requires_grad=True)
    weight = torch.randn(V, H, generator=g)
    base_logits = ((hidden.detach() + 0.5 * torch.randn(B, L, H, generator=g)) @ weight.t())[:, :-1]
    kl_mask = masks.decision | masks.general
    topk = topk_targets(base_logits[kl_mask], masks.targets[kl_mask], K)
    settings = LossSettings(kl_direction=direction, kl_weight=2.0, chunk_size=5, base_targets="topk")
    out = mol_loss(hidden, None, (weight, None), (weight, None), masks, step_counts(masks), settings, topk)
    (grad,) = torch.autograd.grad(out.loss, hidden)
    ref = _coarse_reference(hidden, weight, topk, masks, settings)
    (ref_grad,) = torch.autograd.grad(ref, hidden)
    assert out.loss.item() == pytest.approx(ref.item(), rel=1e-5)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-4, atol=1e-6)


CHANGES = {  # per key part: a change of the run's inputs that changes that part (and no other but K)
    "base": lambda c, ex, tok: (dataclasses.replace(c, model=dataclasses.replace(c.model, seed=1)), ex, tok),
    "traces": lambda c, ex, tok: (c, [{**ex[0], "input_ids": [9, *ex[0]["input_ids"][1:]]}, *ex[1:]], tok),
    "max_length": lambda c, ex, tok: (dataclasses.replace(c, data=dataclasses.replace(c.data, max_length=512)), ex, tok),
    "chat_template": lambda c, ex, tok: (c, ex, SimpleNamespace(chat_template=tok.chat_template + " ")),
    "dtype": lambda c, ex, tok: (dataclasses.replace(c, model=dataclasses.replace(c.model, dtype="bfloat16")), ex, tok),
    "mode": lambda c, ex, tok: (dataclasses.replace(c, loss=dataclasses.replace(c.loss, base_targets="hidden")), ex, tok),
    "k": lambda c, ex, tok: (dataclasses.replace(c, loss=dataclasses.replace(c.loss, base_topk=32)), ex, tok),
}


def test_the_changes_cover_every_key_part():
    assert set(CHANGES) == {f.name for f in dataclasses.fields(CacheKey)}


@pytest.mark.parametrize("part", list(CHANGES))
def test_a_cache_with_one_key_part_changed_is_refused_naming_it(tmp_path, part):
    cfg = MolConfig(model="tiny:chatml", loss=LossSettings(base_targets="topk"))
    examples, tok = synthetic_examples(3), SimpleNamespace(chat_template="{{ messages }}")
    saved = cache_key(cfg, examples, tok)
    changed = cache_key(*CHANGES[part](cfg, examples, tok))
    differing = [f.name for f in dataclasses.fields(CacheKey) if getattr(saved, f.name) != getattr(changed, f.name)]
    assert differing == ([part, "k"] if part == "mode" else [part])  # hidden keeps no K
    (tmp_path / "manifest.json").write_text(json.dumps({"key": dataclasses.asdict(saved)}))
    assert check_key(tmp_path, saved)
    with pytest.raises(MolrlError) as err:
        check_key(tmp_path, changed)
    line = str(err.value)
    assert "\n" not in line and f"({part} was " in line and "never used" in line


def test_a_killed_build_resumes_from_its_last_whole_shard(tmp_path, monkeypatch):
    import molrl.records.writes

    cfg, examples, tokenizer, trainer = _trainer(tmp_path, mode="topk", base_topk=8)
    kill_point = molrl.records.writes._kill_point

    def killed(name):
        if name == "shard-00002.pt":
            raise KeyboardInterrupt  # the process dies with this shard's bytes under its temporary name
        kill_point(name)

    monkeypatch.setattr(molrl.records.writes, "_kill_point", killed)
    with pytest.raises(KeyboardInterrupt):
        prepare(cfg, examples, tokenizer, trainer, shard_examples=2)  # 8 examples: 4 shards
    [folder] = (tmp_path / "base_targets").iterdir()  # the store's one entry, named by its key
    assert folder.name == base_cache.entry_name(cache_key(cfg, examples, tokenizer))
    assert sorted(p.name for p in folder.iterdir()) == [f".shard-00002.pt.tmp-{os.getpid()}", "key.json",
                                                        "shard-00000.pt", "shard-00001.pt"]  # no manifest
    monkeypatch.setattr(molrl.records.writes, "_kill_point", kill_point)
    forwards = []
    base_hidden = trainer._base_hidden
    monkeypatch.setattr(trainer, "_base_hidden", lambda *a: forwards.append(1) or base_hidden(*a))
    resumed = prepare(cfg, examples, tokenizer, trainer, shard_examples=2)
    assert len(forwards) == 2 and resumed.manifest["shards_resumed"] == 2  # shards 2 and 3 only, one batch each
    assert not [p for p in folder.iterdir() if ".tmp-" in p.name]  # the torn shard's temporary is gone
    cfg_whole = dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, base_targets_dir=tmp_path / "whole"))
    whole = prepare(cfg_whole, examples, tokenizer, trainer, shard_examples=2)
    for a, b in zip(resumed.rows(range(8)).values(), whole.rows(range(8)).values()):
        assert torch.equal(a, b)


def _run(out: Path, steps: int, *extra: str) -> list[dict]:
    cfg = load_config(MolConfig, REPO / "configs" / "mol_tiny.yaml", [
        f"output_dir={out}", f"train.max_steps={steps}", "train.save_steps=2", "train.report_to=[none]",
        "data.max_length=256", "lora.rank=4", *extra])
    run_mol(cfg)
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_a_resumed_run_reuses_the_cache_and_checks_it_at_every_step(tmp_path, monkeypatch):
    rows = _run(tmp_path / "run", 2, "loss.base_targets=hidden", "loss.base_targets_check_steps=1")
    [manifest] = [json.loads(p.read_text()) for p in (tmp_path / "run" / "base_targets").glob("*/manifest.json")]
    assert manifest["kl_tokens"] > 0 and manifest["bytes_per_kl_token"] > 0
    monkeypatch.setattr(base_cache, "build", lambda *a, **k: pytest.fail("the cache was built again"))
    rows = _run(tmp_path / "run", 4, "loss.base_targets=hidden", "loss.base_targets_check_steps=1")  # extended
    errors = [r["base_targets_error"] for r in rows if "loss" in r]
    assert len(errors) == 4 and max(errors) < 1e-5  # the cached hidden states are the live ones
    assert [r["kl_decision"] for r in rows if "loss" in r][-1] > 1e-6  # measured where the policy left the base


def test_topk_run_logs_its_covered_mass_and_warns_once_when_low(tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    rows = _run(tmp_path / "run", 2, "loss.base_targets=topk", "loss.base_topk=2", "loss.base_targets_check_steps=1")
    logged = [r for r in rows if "loss" in r]
    assert all(0 < r["base_targets_covered_mass"] < 0.99 for r in logged)  # 2 of 263 byte tokens, random weights
    assert all(r["base_targets_error"] > 0 for r in logged)  # the top-2 KL is below the full one
    warned = [r.getMessage() for r in caplog.records if "raise loss.base_topk" in r.getMessage()]
    assert len(warned) == 1 and "\n" not in warned[0]


@pytest.mark.parametrize("overrides,named", [
    (["loss.base_targets=topk", "loss.temperature=2"], "loss.temperature=2"),
    (["loss.base_topk=8"], "loss.base_topk=8"),
    (["loss.base_targets_check_steps=0"], "loss.base_targets_check_steps=0"),
    (["loss.base_targets_dir=x"], "loss.base_targets_dir="),
    (["loss.base_targets=hidden", "loss.base_topk=8"], "loss.base_topk=8"),
    (["loss.base_targets=hidden", "loss.mode=ce", "loss.monitor_kl=false"], "loss.base_targets='hidden' does nothing"),
    (["loss.mode=ce", "loss.kl_weight=2"], "loss.kl_weight=2"),
    (["loss.monitor_kl=false"], "loss.monitor_kl=False"),
])
def test_a_loss_key_that_would_do_nothing_is_refused_in_one_line(overrides, named):
    traces = REPO / "configs" / "data" / "mol_tiny_traces.jsonl"
    with pytest.raises(ConfigError) as err:
        check_config(load_config(MolConfig, None, [f"data.traces=[{traces}]", *overrides]))
    assert named in str(err.value) and "\n" not in str(err.value)


def test_arms_on_the_same_traces_share_one_cache_and_others_get_their_own(tmp_path, monkeypatch):
    """One store for a pipeline's MoL runs: the second arm on the same traces builds nothing; an arm on other
    traces builds its own entry beside it, and neither is refused."""
    store = tmp_path / "store"
    _run(tmp_path / "mol", 1, "loss.base_targets=hidden", f"loss.base_targets_dir={store}")
    builds = []
    build = base_cache.build
    monkeypatch.setattr(base_cache, "build", lambda *a, **k: builds.append(1) or build(*a, **k))
    _run(tmp_path / "mol_kl10", 1, "loss.base_targets=hidden", "loss.kl_weight=10", f"loss.base_targets_dir={store}")
    _run(tmp_path / "ce", 1, "loss.base_targets=hidden", "loss.mode=ce", f"loss.base_targets_dir={store}")
    assert builds == [] and len(list(store.iterdir())) == 1  # the KL weight and the loss are not in the key
    _run(tmp_path / "short", 1, "loss.base_targets=hidden", "data.max_length=240", f"loss.base_targets_dir={store}")
    assert builds == [1] and len(list(store.iterdir())) == 2


def test_a_finished_run_on_cached_targets_rerun_with_another_store_or_check_interval_changes_no_file(tmp_path):
    """``molrl.records.rerun.HARMLESS``: the store's folder and the check interval change no weight."""
    out = tmp_path / "run"
    _run(out, 2, "loss.base_targets=hidden")
    before = {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}
    _run(out, 2, "loss.base_targets=hidden", f"loss.base_targets_dir={tmp_path / 'elsewhere'}",
         "loss.base_targets_check_steps=7")
    assert {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before
    assert not (tmp_path / "elsewhere").exists()  # a finished run builds no cache
