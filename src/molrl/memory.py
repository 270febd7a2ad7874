"""GPU memory arithmetic for MoL and GRPO runs, from a model's architecture numbers.

The estimates count the tensors that dominate: weights, trainable state, the KL reference,
checkpointed activations and the loss path. They leave out the CUDA context and allocator
fragmentation (add ~2-4 GB per GPU). ``python -m molrl.memory`` prints the Qwen3 tables the
README quotes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

GB = 1e9


@dataclass(frozen=True)
class Arch:
    """The numbers of a decoder-only transformer that decide its memory."""

    vocab: int
    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    tied_embeddings: bool


QWEN3 = {
    "Qwen3-0.6B": Arch(151_936, 1024, 3072, 28, 16, 8, 128, True),
    "Qwen3-1.7B": Arch(151_936, 2048, 6144, 28, 16, 8, 128, True),
    "Qwen3-4B": Arch(151_936, 2560, 9728, 36, 32, 8, 128, True),
    "Qwen3-8B": Arch(151_936, 4096, 12288, 36, 32, 8, 128, False),
}


def linear_shapes(a: Arch) -> list[tuple[int, int]]:
    """(in, out) of the seven linear layers of one decoder block (q, k, v, o, gate, up, down)."""
    q, kv = a.heads * a.head_dim, a.kv_heads * a.head_dim
    return [(a.hidden, q), (a.hidden, kv), (a.hidden, kv), (q, a.hidden),
            (a.hidden, a.intermediate), (a.hidden, a.intermediate), (a.intermediate, a.hidden)]


def num_params(a: Arch) -> int:
    """Parameter count: embeddings, linear layers, RMSNorm weights (incl. Qwen3's q/k norms), head."""
    per_layer = sum(i * o for i, o in linear_shapes(a)) + 2 * a.hidden + 2 * a.head_dim
    head = 0 if a.tied_embeddings else a.vocab * a.hidden
    return a.vocab * a.hidden + a.layers * per_layer + a.hidden + head


def num_lora_params(a: Arch, rank: int) -> int:
    """LoRA parameters on all seven linear layers of every block: rank * (in + out) each."""
    return a.layers * sum(rank * (i + o) for i, o in linear_shapes(a))


def kv_cache_bytes_per_token(a: Arch, dtype_bytes: int = 2) -> int:
    """KV-cache bytes per token for generation (keys and values of every layer)."""
    return 2 * a.layers * a.kv_heads * a.head_dim * dtype_bytes


def training_memory(
    a: Arch,
    *,
    method: Literal["lora", "full"],
    seq_len: int,
    gpus: int = 1,
    sharding: Literal["none", "zero2", "zero3", "fsdp"] = "none",
    lora_rank: int = 64,
    loss_path: Literal["chunked", "naive"] = "chunked",
    chunk_tokens: int = 1024,
    micro_batch: int = 1,
) -> dict[str, float]:
    """Per-GPU bytes of one MoL training step, term by term (bf16 weights, fp32 Adam)."""
    n = num_params(a)
    shard_all = sharding in ("zero3", "fsdp")
    shard_state = sharding != "none"
    weights = 2 * n / (gpus if shard_all else 1)
    if method == "lora":
        # fp32 adapter weights + fp32 grads + two fp32 Adam moments; the KL reference is the
        # same weights with the adapter disabled, so it costs nothing.
        trainable = 16 * num_lora_params(a, lora_rank) / (gpus if shard_state else 1)
        reference = 0.0
    else:
        # bf16 grads (2) + fp32 master copy and Adam moments (12); ZeRO-2 shards the 14,
        # ZeRO-3/FSDP shard them and the weights. The KL reference is a frozen bf16 copy.
        trainable = (2 * n / (gpus if shard_state else 1)) + 12 * n / (gpus if shard_state else 1)
        reference = 2 * n / (gpus if shard_all else 1)
    tokens = seq_len * micro_batch
    # Gradient checkpointing keeps each block's bf16 input, plus one block's recompute set.
    activations = 2 * tokens * (a.layers * a.hidden + 4 * a.hidden + 3 * a.intermediate)
    logits_rows = min(chunk_tokens, tokens) if loss_path == "chunked" else tokens
    # fp32 policy logits, base logits and the logits' gradient (naive also keeps log-softmax).
    loss = 4 * logits_rows * a.vocab * (3 if loss_path == "chunked" else 4)
    parts = {"weights": weights, "trainable_state": trainable, "kl_reference": reference,
             "activations": activations, "loss_path": loss}
    parts["total"] = sum(parts.values())
    return {k: v / GB for k, v in parts.items()}


def _table() -> str:
    rows = ["| model | setup | GPUs | seq | weights | trainable | reference | activations | loss path | total (GB/GPU) |",
            "|---|---|---|---|---|---|---|---|---|---|"]
    setups = [("lora", "none", 1, "LoRA r64, 1 GPU"), ("lora", "zero2", 8, "LoRA r64, ZeRO-2"),
              ("full", "zero2", 8, "full FT, ZeRO-2"), ("full", "zero3", 8, "full FT, ZeRO-3"),
              ("full", "fsdp", 8, "full FT, FSDP")]
    for name in ("Qwen3-4B", "Qwen3-8B"):
        for method, sharding, gpus, label in setups:
            for seq in (4096, 8192):
                m = training_memory(QWEN3[name], method=method, seq_len=seq, gpus=gpus, sharding=sharding)
                rows.append(f"| {name} | {label} | {gpus} | {seq} | {m['weights']:.1f} | {m['trainable_state']:.1f} | "
                            f"{m['kl_reference']:.1f} | {m['activations']:.1f} | {m['loss_path']:.1f} | {m['total']:.1f} |")
    return "\n".join(rows)


if __name__ == "__main__":
    for name, arch in QWEN3.items():
        print(f"{name}: {num_params(arch) / 1e9:.2f}B params, LoRA r64 {num_lora_params(arch, 64) / 1e6:.1f}M, "
              f"KV cache {kv_cache_bytes_per_token(arch) / 1024:.0f} KiB/token")
    print()
    print(_table())
    naive = training_memory(QWEN3["Qwen3-8B"], method="lora", seq_len=8192, loss_path="naive")
    print(f"\nQwen3-8B LoRA, 8k tokens, naive full-logits loss path: {naive['loss_path']:.1f} GB "
          f"(total {naive['total']:.1f} GB)")
