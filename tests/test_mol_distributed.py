"""Two data-parallel CPU processes (gloo) give the same step as one process with the whole batch."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from test_mol_trainer import one_step_update, synthetic_examples


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world), ACCELERATE_USE_CPU="true")
    torch.set_num_threads(1)
    loss, delta = one_step_update(Path(out_dir) / f"rank{rank}", synthetic_examples(),
                                  micro_batch_size=4, grad_accumulation=1)
    world_seen = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    torch.save({"loss": loss, "delta": delta, "world": world_seen}, Path(out_dir) / f"result{rank}.pt")
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def test_two_processes_equal_one_process(tmp_path):
    # 1 process x micro-batch 8 against 2 processes x micro-batch 4: the same 8 examples per step
    # (accelerate gives rank r the r-th batch of the sampler's order).
    loss_one, delta_one = one_step_update(tmp_path / "one", synthetic_examples(), micro_batch_size=8,
                                          grad_accumulation=1)
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    results = [torch.load(tmp_path / f"result{r}.pt") for r in range(2)]
    for result in results:
        assert result["world"] == 2
        assert result["loss"] == pytest.approx(loss_one, rel=1e-5)
        for name, delta in delta_one.items():
            torch.testing.assert_close(result["delta"][name], delta, rtol=1e-4, atol=1e-7)
