"""MoL training step: our chunked loss vs a naive full-logits MoL step vs a plain CE (SFT) step.

Measured side by side in one run on the same batch and the same LoRA model (rank 64, all linear
layers), for the tiny test model and a Qwen3-0.6B-shaped random model with the real Qwen3
vocabulary (151,936):
  (a) mol    MolTrainer.compute_loss + backward: hidden states only, logits in chunks at loss positions
  (b) naive  full [B, L, V] logits for policy and base, log_softmax, CE + reverse KL, backward
  (c) ce     the model's own forward with labels (HF cross-entropy on full logits), backward
  (d) hidden the mol step with the base's final hidden states read from a cache built once (``molrl.mol.base_cache``)
  (e) topk   the mol step with the base's cached top K (``--topk``) log-probs and tail: the KL over K + 1 classes
Figures: step time, whole-step peak memory, and loss-path peak memory (from final hidden states to
the loss and back to the hidden states, on the same tensors). Goals: mol <= 1.35x ce step time;
loss-path peak memory >= 4x below naive. For the cached variants (``--cached``): their step ÷ the CE step beside
live's, the per-token |KL cached - KL live| with the adapter moved off zero (the trainer's own check), the cache's
bytes per decision token, and its build time against one epoch of these traces (one live MoL step each).

    python benchmarks/mol_step.py --tokenizer PATH/qwen3_tokenizer                 # CPU, reduced
    python benchmarks/mol_step.py --tokenizer PATH/qwen3_tokenizer --device cuda --dtype bfloat16 \\
        --seq-len 4096 --layers 28 --steps 5

CPU memory is the kernel's resident-set high-water mark (VmHWM, reset through /proc/self/clear_refs)
above the resident set before the measured code (tensors that large are mmap-backed, so frees
return to the OS); CUDA memory is ``torch.cuda.max_memory_allocated`` above the level before.
"""

from __future__ import annotations

import argparse
import gc
import math
import time
from contextlib import contextmanager

import torch

from molrl.mol.losses import LossSettings, mol_loss, step_counts, token_masks

def make_batch(seq_len: int, vocab: int, device: str, seed: int = 0, traces: int = 1) -> dict[str, torch.Tensor]:
    """``traces`` traces of ``seq_len`` tokens: 25% prompt, then alternating decision (~200 tokens) and feedback
    (~150) spans."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (traces, seq_len), generator=g)
    decision = torch.zeros(traces, seq_len, dtype=torch.long)
    feedback = torch.zeros(traces, seq_len, dtype=torch.long)
    t, turn = seq_len // 4, 0
    while t < seq_len:
        span = 200 if turn % 2 == 0 else 150
        (decision if turn % 2 == 0 else feedback)[:, t: t + span] = 1
        t, turn = t + span, turn + 1
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "feedback_mask": feedback,
             "decision_mask": decision, "is_general": torch.zeros(traces, dtype=torch.bool)}
    return {k: v.to(device) for k, v in batch.items()}


SHAPES = {  # the real Qwen3 configurations (random weights here), without vocabulary and depth
    "qwen3-0.6b": dict(hidden_size=1024, intermediate_size=3072, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128),
    "qwen3-1.7b": dict(hidden_size=2048, intermediate_size=6144, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128),
}
"""Qwen3 shapes by name (both 28 layers deep, tied embeddings)."""


def build_model(kind: str, vocab: int, layers: int, dtype: torch.dtype, device: str, path: str | None = None):
    """A LoRA-wrapped model: the tiny test model, a Qwen3-shaped random one (``SHAPES``), or ``pretrained`` (the
    model folder ``path``, e.g. SmolLM2-135M-Instruct exported by ``molrl export --gguf``)."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, Qwen3Config, Qwen3ForCausalLM

    from molrl.tiny import build_tiny_pair

    if kind == "tiny":
        model, _ = build_tiny_pair("chatml")
    elif kind == "pretrained":
        if not path:
            raise SystemExit("--models pretrained needs --model-path DIR (a model folder)")
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    else:
        config = Qwen3Config(vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=True,
                             max_position_embeddings=40960, **SHAPES[kind])
        torch.manual_seed(0)
        with torch.device(device):
            model = Qwen3ForCausalLM(config)
    model = model.to(device=device, dtype=dtype)
    model.config.use_cache = False
    lora = LoraConfig(r=64, lora_alpha=128, lora_dropout=0.0, target_modules="all-linear", task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def mol_step_flops(config, batch: dict[str, torch.Tensor], lora_rank: int = 64) -> float:
    """Model FLOPs of one MoL step with LoRA on every linear layer of the blocks (recomputation not counted).

    Per token, with P the blocks' linear parameters: the policy's forward (2P) and its backward to the
    activations (2P; the frozen base weights get no gradient), the frozen base's forward for the KL (2P),
    and LoRA's forward, input and weight gradients (6 r (in + out) per adapted linear). Causal attention
    adds 2 x heads x head_dim x L^2 per layer per forward, twice that in backward. The head's logits are
    formed at loss positions only: policy forward and backward to the hidden states, base forward at KL rows.
    """
    c = config
    hidden, inter, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
    q, kv = c.num_attention_heads * c.head_dim, c.num_key_value_heads * c.head_dim
    shapes = [(hidden, q), (hidden, kv), (hidden, kv), (q, hidden), (hidden, inter), (hidden, inter), (inter, hidden)]
    linear = layers * sum(a * b for a, b in shapes)
    lora = layers * sum(lora_rank * (a + b) for a, b in shapes)
    tokens = int(batch["attention_mask"].sum())
    seq = batch["input_ids"].shape[1]
    attention = layers * 2 * q * seq * seq * batch["input_ids"].shape[0]  # one forward, causal
    masks = _masks(batch)
    n_loss = int((masks.feedback | masks.decision | masks.general).sum())
    n_kl = int((masks.decision | masks.general).sum())
    head = 2 * c.vocab_size * hidden
    return (6 * linear + 6 * lora) * tokens + 4 * attention + head * (2 * n_loss + n_kl)


def make_trainer(model, device: str):
    from transformers import TrainingArguments

    from molrl.mol.trainer import MolTrainer

    args = TrainingArguments(output_dir="/tmp/mol_step_bench", report_to="none", use_cpu=device == "cpu",
                             per_device_train_batch_size=1, remove_unused_columns=False)
    return MolTrainer(model=model, args=args, loss_settings=LossSettings())


def cached_trainers(model, batch, device: str, k: int, folder) -> dict[str, tuple]:
    """Per cached variant: a trainer reading the base's targets from a cache built here, once, over ``batch``'s
    traces (one example each), and the cache's manifest."""
    from pathlib import Path

    from transformers import TrainingArguments

    from molrl.mol.base_cache import BaseTargetsCache, CacheKey, build
    from molrl.mol.trainer import MolTrainer

    examples = [{"input_ids": batch["input_ids"][b].tolist(), "feedback_mask": batch["feedback_mask"][b].tolist(),
                 "decision_mask": batch["decision_mask"][b].tolist(), "is_general": False, "index": b}
                for b in range(batch["input_ids"].shape[0])]
    out = {}
    for mode in ("hidden", "topk"):
        args = TrainingArguments(output_dir="/tmp/mol_step_bench", report_to="none", use_cpu=device == "cpu",
                                 per_device_train_batch_size=1, remove_unused_columns=False)
        trainer = MolTrainer(model=model, args=args, loss_settings=LossSettings(base_targets=mode, base_topk=k,
                                                                                base_targets_check_steps=1))
        key = CacheKey(base="benchmark", traces="-", max_length=0, chat_template="-", dtype=str(model.dtype),
                       mode=mode, k=k if mode == "topk" else None)
        manifest = build(Path(folder) / mode, key, trainer, examples, batch_size=1, pad_token_id=0)
        trainer.base_targets = BaseTargetsCache(Path(folder) / mode, manifest)
        out[mode] = (trainer, manifest)
    return out


def kl_against_live(trainers: dict, live_trainer, model, batch) -> dict[str, dict[str, float]]:
    """With the adapter moved off zero: the live mean KL per decision token, and each cached variant's mean
    |KL cached - KL live| per token through the trainer's own check (``base_targets_error``)."""
    g = torch.Generator().manual_seed(0)
    saved = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_B" in n}
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(0.02 * torch.randn(p.shape, generator=g).to(p))
    counts = step_counts(_masks(batch))
    out = {}
    model.train()
    with torch.no_grad():
        live_trainer._sums.clear()
        live_trainer.compute_loss(model, batch, num_items_in_batch=counts)
        kl_live = live_trainer._sums["kl_decision_sum"] / float(counts[1])
        for name, trainer in trainers.items():
            trainer._sums.clear()
            trainer._checked_step = -1
            trainer.compute_loss(model, batch, num_items_in_batch=counts)
            sums = trainer._sums
            out[name] = {"kl_live": kl_live, "kl_cached": sums["kl_decision_sum"] / float(counts[1]),
                         "kl_error": sums["base_targets_error_sum"] / sums["base_targets_error_tokens"]}
            if "base_covered_tokens" in sums:
                out[name]["covered_mass"] = sums["base_covered_sum"] / sums["base_covered_tokens"]
        live_trainer._sums.clear()
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in saved:
                    p.copy_(saved[n])
    return out


def step_mol(trainer, model, batch):
    counts = step_counts(_masks(batch))
    trainer.compute_loss(model, batch, num_items_in_batch=counts).backward()


def step_naive(_trainer, model, batch):
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits  # [B, L, V]
    with torch.no_grad(), model.disable_adapter():
        base_logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    naive_loss(logits, base_logits, _masks(batch)).backward()


def step_ce(_trainer, model, batch):
    carries = (batch["feedback_mask"] + batch["decision_mask"]).bool()
    labels = torch.where(carries, batch["input_ids"], torch.full_like(batch["input_ids"], -100))
    model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels).loss.backward()


def naive_loss(logits, base_logits, masks):
    """CE on feedback + reverse KL on decisions from full logits [B, L, V]."""
    logp = torch.log_softmax(logits[:, :-1].float(), -1)  # [B, L-1, V]
    logq = torch.log_softmax(base_logits[:, :-1].float(), -1)  # [B, L-1, V]
    ce = -logp.gather(-1, masks.targets[..., None]).squeeze(-1)  # [B, L-1]
    kl = (logp.exp() * (logp - logq)).sum(-1)  # [B, L-1]
    return ce[masks.feedback].sum() / masks.feedback.sum() + kl[masks.decision].sum() / masks.decision.sum()


def _masks(batch):
    return token_masks(batch["input_ids"], batch["feedback_mask"], batch["decision_mask"],
                       batch["attention_mask"], batch["is_general"])


def loss_path(kind: str, hidden, base_hidden, weight, batch):
    """Only the loss path: from final hidden states [B, L, H] to the loss, and back."""
    masks = _masks(batch)
    if kind == "mol":
        out = mol_loss(hidden, base_hidden, (weight, None), (weight, None), masks, step_counts(masks), LossSettings())
        out.loss.backward()
    elif kind == "naive":
        naive_loss(hidden @ weight.t(), base_hidden @ weight.t(), masks).backward()
    else:
        from transformers.loss.loss_utils import ForCausalLMLoss

        carries = (batch["feedback_mask"] + batch["decision_mask"]).bool()
        labels = torch.where(carries, batch["input_ids"], torch.full_like(batch["input_ids"], -100))
        ForCausalLMLoss(hidden @ weight.t(), labels, vocab_size=weight.shape[0]).backward()


@contextmanager
def peak_memory(device: str):
    """Yields a dict that holds 'peak' (bytes above the level at entry) once the block ends."""
    result = {}
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        start = torch.cuda.memory_allocated()
        yield result
        torch.cuda.synchronize()
        result["peak"] = torch.cuda.max_memory_allocated() - start
        return
    # Reset the kernel's resident-set high-water mark (VmHWM) to the current level, run, read it back.
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    start = _status_kb("VmRSS")
    yield result
    result["peak"] = (_status_kb("VmHWM") - start) * 1024


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {key}")


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def measure(kind_name: str, args, vocab: int) -> list[dict]:
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    model = build_model(kind_name, vocab, args.layers, dtype, args.device, getattr(args, "model_path", None))
    vocab = model.get_output_embeddings().weight.shape[0]
    seq_len = args.tiny_seq_len if kind_name == "tiny" else args.seq_len
    traces = getattr(args, "traces", 1)
    batch = make_batch(seq_len, vocab, args.device, traces=traces)
    flops = mol_step_flops(model.get_base_model().config, batch)
    trainer = make_trainer(model, args.device)
    # Loss paths first, while the process holds nothing but the model (freed step buffers would hide them).
    loss_path_mb = {}
    weight = model.get_output_embeddings().weight.detach()
    with torch.no_grad():
        hidden0 = model.get_base_model().model(input_ids=batch["input_ids"]).last_hidden_state  # [B, L, H]
    variants = getattr(args, "variants", ("mol", "naive", "ce"))
    for name in variants:
        hidden = hidden0.clone().requires_grad_(True)
        base_hidden = hidden0 + 0.01 * torch.randn_like(hidden0)
        with peak_memory(args.device) as mem:
            loss_path(name, hidden, base_hidden, weight, batch)
        loss_path_mb[name] = mem["peak"] / 2**20
        del hidden, base_hidden
    trainers = {name: trainer for name in ("mol", "naive", "ce")}
    caches = {}
    if getattr(args, "cached", False):
        import tempfile

        folder = tempfile.mkdtemp(prefix="mol_step_cache_")
        batch["index"] = torch.arange(batch["input_ids"].shape[0], device=args.device)
        caches = cached_trainers(model, batch, args.device, args.topk, folder)
        trainers.update({name: t for name, (t, _) in caches.items()})
        for name in caches:
            trainers[name].loss_settings = LossSettings(base_targets=name, base_topk=args.topk,
                                                        base_targets_check_steps=0)  # timed steps: no check
    rows = []
    for name, step in (("mol", step_mol), ("naive", step_naive), ("ce", step_ce), ("hidden", step_mol),
                       ("topk", step_mol)):
        if name not in variants and name not in caches:
            continue
        trainer = trainers[name]
        times = []
        try:
            for _ in range(args.warmup):
                step(trainer, model, batch)
                model.zero_grad(set_to_none=True)
            _sync(args.device)
            with peak_memory(args.device) as mem:
                for _ in range(args.steps):
                    t0 = time.perf_counter()
                    step(trainer, model, batch)
                    _sync(args.device)
                    times.append(time.perf_counter() - t0)
                    model.zero_grad(set_to_none=True)
        except torch.OutOfMemoryError:  # a baseline too large for the device: the other variants' rows still count
            model.zero_grad(set_to_none=True)
            gc.collect()
            if args.device == "cuda":
                torch.cuda.empty_cache()
            rows.append({"model": kind_name, "variant": name, "seq_len": seq_len, "error": "out of memory"})
            continue
        rows.append({"model": kind_name, "variant": name, "seq_len": seq_len, "step_s": min(times),
                     "tokens_per_s": traces * seq_len / min(times), "step_peak_mb": mem["peak"] / 2**20,
                     "loss_path_peak_mb": loss_path_mb.get(name, math.nan), "mol_model_flops": flops})
    if caches:  # the ratios from rounds that run every variant once, so a busy spell of the machine hits them alike
        steps = {"mol": step_mol, "ce": step_ce, "hidden": step_mol, "topk": step_mol}
        best = {name: math.inf for name in steps}
        for _ in range(args.steps):
            for name, step in steps.items():
                t0 = time.perf_counter()
                step(trainers[name], model, batch)
                _sync(args.device)
                best[name] = min(best[name], time.perf_counter() - t0)
                model.zero_grad(set_to_none=True)
        for r in rows:
            r["interleaved_step_s"] = best.get(r["variant"])
        for name in caches:
            trainers[name].loss_settings = LossSettings(base_targets=name, base_topk=args.topk,
                                                        base_targets_check_steps=1)
        errors = kl_against_live({n: trainers[n] for n in caches}, trainers["mol"], model, batch)
        for r in rows:
            if r["variant"] in caches:
                r.update(cache=caches[r["variant"]][1], **errors[r["variant"]])
    del model, trainer, trainers
    gc.collect()
    return rows


def measure_loss_path(args, vocab: int) -> None:
    """Loss-path peak memory and time only, at several lengths (real vocabulary, 0.6B hidden size)."""
    device, dtype = args.device, {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    g = torch.Generator().manual_seed(0)
    weight = (0.02 * torch.randn(vocab, 1024, generator=g)).to(device=device, dtype=dtype)  # [V, H]
    print(f"{'variant':6} {'seq':>6} {'loss-path s':>12} {'loss-path MB':>13}")
    for seq_len in args.loss_path_seq_lens:
        batch = make_batch(seq_len, vocab, device)
        hidden0 = torch.randn(1, seq_len, 1024, generator=g).to(device=device, dtype=dtype)  # [B, L, H]
        for variant in args.loss_path_variants.split(","):
            if variant == "naive" and seq_len > args.naive_max_seq_len:
                continue
            hidden = hidden0.clone().requires_grad_(True)
            base_hidden = hidden0 + 0.01 * torch.randn_like(hidden0)
            with peak_memory(device) as mem:
                t0 = time.perf_counter()
                loss_path(variant, hidden, base_hidden, weight, batch)
                _sync(device)
                elapsed = time.perf_counter() - t0
            print(f"{variant:6} {seq_len:>6} {elapsed:>12.2f} {mem['peak'] / 2**20:>13.1f}", flush=True)
            del hidden, base_hidden
            gc.collect()


def report(rows: list[dict]) -> None:
    print(f"{'model':8} {'variant':6} {'seq':>6} {'step s':>9} {'tok/s':>9} {'step peak MB':>13} {'loss-path MB':>13}")
    for r in rows:
        if "error" in r:
            print(f"{r['model']:8} {r['variant']:6} {r['seq_len']:>6} {r['error']}")
            continue
        print(f"{r['model']:8} {r['variant']:6} {r['seq_len']:>6} {r['step_s']:>9.4f} {r['tokens_per_s']:>9.0f} "
              f"{r['step_peak_mb']:>13.1f} {r['loss_path_peak_mb']:>13.1f}")
    for model in dict.fromkeys(r["model"] for r in rows):
        by = {r["variant"]: r for r in rows if r["model"] == model}
        if any("error" in r for r in by.values()):
            continue  # no ratios against a variant that did not run
        if "hidden" in by:
            report_cached(model, by)
        if "naive" not in by:
            continue
        t_ratio = by["mol"]["step_s"] / by["ce"]["step_s"]
        print(f"{model}: mol/ce step time {t_ratio:.2f}x (goal <= 1.35x) | naive/mol step time "
              f"{by['naive']['step_s'] / by['mol']['step_s']:.2f}x | naive/mol loss-path memory "
              f"{_ratio(by['naive']['loss_path_peak_mb'], by['mol']['loss_path_peak_mb'])} (goal >= 4x) | "
              f"naive/mol whole-step peak {_ratio(by['naive']['step_peak_mb'], by['mol']['step_peak_mb'])}")


def report_cached(model: str, by: dict[str, dict]) -> None:
    """The cached variants against live: step ÷ CE step, KL error, bytes per decision token, build ÷ one epoch."""
    ce, live = by["ce"]["interleaved_step_s"], by["mol"]["interleaved_step_s"]
    print(f"{model}: step ÷ CE step (fastest of rounds interleaving the variants): live {live / ce:.3f}x, hidden "
          f"{by['hidden']['interleaved_step_s'] / ce:.3f}x, topk {by['topk']['interleaved_step_s'] / ce:.3f}x")
    for name in ("hidden", "topk"):
        r, m = by[name], by[name]["cache"]
        covered = f", covered mass {r['covered_mass']:.4f}" if "covered_mass" in r else ""
        print(f"{model} {name}: KL live {r['kl_live']:.5f}, cached {r['kl_cached']:.5f}, |KL cached - KL live| per "
              f"token {r['kl_error']:.2e}{covered}; {m['bytes_per_kl_token']:.1f} bytes per decision token; build "
              f"{m['build_seconds']:.3f} s = {m['build_seconds'] / live:.2f}x one epoch of live MoL steps "
              f"({live:.3f} s), saving {live - r['interleaved_step_s']:.3f} s a later epoch")


def _ratio(a_mb: float, b_mb: float) -> str:
    # The CPU resident set cannot see allocations of a few MB (the heap reuses them).
    return f"{a_mb / b_mb:.1f}x" if min(a_mb, b_mb) >= 1.0 else "n/a (below 1 MB resolution)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", help="real Qwen3 tokenizer directory (its vocabulary sizes the 0.6B model)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--seq-len", type=int, default=4096, help="tokens per trace for the 0.6B-shaped model")
    parser.add_argument("--tiny-seq-len", type=int, default=4096, help="tokens per trace for the tiny model")
    parser.add_argument("--layers", type=int, default=28, help="decoder layers of the 0.6B-shaped model (28 real)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per variant (the fastest is reported)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--threads", type=int, default=0, help="CPU threads (0: torch default)")
    parser.add_argument("--models", default="tiny,qwen3-0.6b",
                        help="comma-separated: tiny, pretrained (--model-path), " + ", ".join(SHAPES))
    parser.add_argument("--model-path", help="the model folder of --models pretrained (e.g. SmolLM2's export)")
    parser.add_argument("--loss-path-only", action="store_true",
                        help="measure only the loss path (real vocabulary, hidden 1024) at --loss-path-seq-lens")
    parser.add_argument("--loss-path-seq-lens", type=int, nargs="+", default=[1024, 2048, 4096])
    parser.add_argument("--loss-path-variants", default="mol,naive,ce")
    parser.add_argument("--cached", action="store_true",
                        help="also time the mol step on cached base targets (hidden and topk)")
    parser.add_argument("--topk", type=int, default=64, help="K of the topk cache")
    parser.add_argument("--variants", default="mol,naive,ce", help="comma-separated: mol, naive, ce")
    parser.add_argument("--naive-max-seq-len", type=int, default=1 << 30,
                        help="skip the naive loss path above this length (its memory grows as L x V)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    vocab = 151_936
    if args.tokenizer:
        from transformers import AutoConfig, AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        vocab = max(vocab, len(tok))
        try:
            vocab = AutoConfig.from_pretrained(args.tokenizer).vocab_size
        except (OSError, ValueError):
            pass
    print(f"device {args.device}, dtype {args.dtype}, torch {torch.__version__}, threads {torch.get_num_threads()}, "
          f"Qwen3 shapes with {args.layers} layers, vocab {vocab}")
    if args.loss_path_only:
        measure_loss_path(args, vocab)
        return
    args.variants = tuple(args.variants.split(","))
    for kind in args.models.split(","):
        report(measure(kind, args, vocab))  # each model's figures as soon as they are measured


if __name__ == "__main__":
    main()
