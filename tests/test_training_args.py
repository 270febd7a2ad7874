"""The one builder of the training arguments: the same ``train`` block gives MoL and RL the same shared fields."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from transformers import TrainingArguments

from molrl.config.blocks import MolTrainConfig, TrainConfig
from molrl.mol.config import MolConfig
from molrl.mol.run import _training_arguments
from molrl.rl.config import RlConfig, rl_sampling
from molrl.rl.run import trl_args
from molrl.config.training_args import shared_fields, training_arguments

# every value away from both stages' defaults, so a field one stage forgets shows
TRAIN = dict(optim="sgd", learning_rate=3e-4, lr_scheduler="linear", warmup_ratio=0.0, warmup_steps=2,
             weight_decay=0.01, max_grad_norm=0.5, max_steps=7, micro_batch_size=2, seed=11, bf16=False,
             gradient_checkpointing=True, logging_steps=3, save_steps=4, save_total_limit=5, report_to=["none"])

STAGE_OWN = {"gradient_accumulation_steps", "num_train_epochs", "remove_unused_columns"}
"""``TrainingArguments`` fields a stage sets itself (MoL's set accumulation and epochs, RL's derived accumulation)."""


def _both(tmp_path: Path):
    mol = MolConfig(output_dir=tmp_path / "mol", train=MolTrainConfig(**TRAIN, grad_accumulation=4))
    rl = RlConfig(output_dir=tmp_path / "rl", train=TrainConfig(**TRAIN),
                  sampling=rl_sampling(n=2), prompts_per_step=4)
    return (_training_arguments(mol, TrainingArguments, cuda=False),
            trl_args(rl, tmp_path / "rl" / "checkpoints", cuda=False))


def test_the_same_train_block_gives_mol_and_rl_the_same_training_arguments(tmp_path):
    mol, rl = _both(tmp_path)
    differ = {f.name: (getattr(mol, f.name), getattr(rl, f.name)) for f in dataclasses.fields(TrainingArguments)
              if f.name not in STAGE_OWN | {"output_dir", "logging_dir"}
              and getattr(mol, f.name) != getattr(rl, f.name)}
    assert differ == {}


def test_every_train_key_reaches_the_training_arguments(tmp_path):
    mol, _ = _both(tmp_path)
    assert (mol.optim, mol.learning_rate, mol.lr_scheduler_type, mol.warmup_steps, mol.weight_decay,
            mol.max_grad_norm, mol.max_steps, mol.per_device_train_batch_size, mol.seed, mol.data_seed,
            mol.activation_checkpointing, mol.gradient_checkpointing, mol.logging_steps, mol.save_steps,
            mol.save_total_limit, mol.report_to) == ("sgd", 3e-4, "linear", 2, 0.01, 0.5, 7, 2, 11, 11, True, True,
                                                     3, 4, 5, [])


def test_a_stage_cannot_set_a_shared_field_again(tmp_path):
    with pytest.raises(TypeError, match="data_seed"):
        training_arguments(TrainingArguments, TrainConfig(report_to=["none"]), "float32", tmp_path, False,
                           data_seed=3)


def test_the_shared_fields_are_training_arguments_fields():
    fields = {f.name for f in dataclasses.fields(TrainingArguments)}
    assert set(shared_fields(TrainConfig(report_to=["none"]), "float32", Path("x"), False)) <= fields
