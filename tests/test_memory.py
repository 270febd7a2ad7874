"""Memory arithmetic: closed-form counts for Qwen3-8B."""

from molrl.memory import QWEN3, kv_cache_bytes_per_token, num_lora_params, num_params, training_memory


def test_qwen3_8b_lora_params_by_hand():
    # Per block, rank 64 * (in + out): q 64*(4096+4096)=524,288; k, v 64*(4096+1024)=327,680 each;
    # o 524,288; gate, up, down 64*(4096+12288)=1,048,576 each -> 4,849,664; x 36 blocks.
    assert num_lora_params(QWEN3["Qwen3-8B"], 64) == 4_849_664 * 36 == 174_587_904


def test_qwen3_8b_param_count_matches_published_size():
    # Qwen3-8B is published as 8.2B parameters (untied embeddings and head).
    assert round(num_params(QWEN3["Qwen3-8B"]) / 1e9, 2) == 8.19


def test_kv_cache_per_token():
    # 2 (k, v) * 36 layers * 8 kv heads * 128 dims * 2 bytes = 147,456 bytes.
    assert kv_cache_bytes_per_token(QWEN3["Qwen3-8B"]) == 147_456


def test_sharding_divides_full_finetune_state():
    one = training_memory(QWEN3["Qwen3-8B"], method="full", seq_len=4096, gpus=1, sharding="none")
    eight = training_memory(QWEN3["Qwen3-8B"], method="full", seq_len=4096, gpus=8, sharding="zero3")
    assert abs(one["trainable_state"] / eight["trainable_state"] - 8) < 1e-9
    assert eight["weights"] * 8 == one["weights"]


def test_chunked_loss_path_is_smaller_than_naive_at_8k():
    kw = dict(method="lora", seq_len=8192)
    chunked = training_memory(QWEN3["Qwen3-8B"], **kw)["loss_path"]
    naive = training_memory(QWEN3["Qwen3-8B"], loss_path="naive", **kw)["loss_path"]
    # naive: 4 * 8192 * V * 4 B; chunked: 3 * 1024 * V * 4 B -> ratio 32/3.
    assert abs(naive / chunked - 32 / 3) < 1e-9
