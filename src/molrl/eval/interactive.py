"""Interactive evaluation: the episode loop (``molrl.episode.loop``) run on benchmark problems.

Each sample is one episode in which the model may execute code, see feedback and resubmit; the
verdict is that of its last submitted solution, judged by the same graders on the tests the episode never
showed (its held-back tests, where its feedback or prompt shows the others: ``molrl.episode.loop``). A problem that
holds no test back, where tests are shown, has no such verdict: its samples are never correct, their verdict on the
tests the policy saw is ``shown_pass``, and the summary scores it apart from the headline pass@1 (``unsplit``).
Scores here depend on feedback, unlike single-turn ones, and are reported for comparison with them.
"""

from __future__ import annotations

from typing import Any, Sequence

from molrl.episode.actions import parse_action
from molrl.episode.config import episode_config
from molrl.episode.loop import Episode, run_episodes
from molrl.eval.config import EvalConfig
from molrl.eval.samples import SampleRecord
from molrl.eval.sources import SamplingSource
from molrl.tasks import Task
from molrl.tasks.grade import GRADING


class InteractiveSource:
    """Graded samples from multi-turn episodes of the configured model."""

    mode = "interactive"

    def __init__(self, cfg: EvalConfig):
        self.cfg = cfg
        self._model = SamplingSource(cfg)  # loads the model once, on first use
        self.label = f"{self._model.label} (interactive)" if not cfg.label else cfg.label

    def close(self) -> None:
        """Release the model's generator."""
        self._model.close()

    def select(self, name: str, tasks: Sequence[Task]) -> list[Task]:
        return list(tasks)

    def plan(self, problems: int) -> None:
        """Record how many problems are left to sample (each an episode of up to ``episode.max_turns`` turns)."""
        self._model.plan(problems, turns=self.cfg.episode.max_turns)

    def finished(self, name: str, task_id: str, records: Sequence[SampleRecord]) -> bool:
        return len(records) == self.cfg.sampling.n

    def model_fingerprints(self) -> dict[str, str]:
        """The fingerprints of the model and adapter that play the episodes."""
        return self._model.model_fingerprints()

    def made_by(self, offset: int) -> dict[str, Any]:
        """The engine, model fingerprints and sampling of the episodes of the chunk at ``offset``."""
        return self._model.made_by(offset)

    def episode_config(self) -> Any:
        """The episode settings: turns and feedback from ``episode``, the batch size from the eval."""
        return episode_config(self.cfg.episode, batch_size=self.cfg.batch_size * self.cfg.sampling.n)

    def records(self, name: str, tasks: Sequence[Task], offset: int, pool: Any) -> list[list[SampleRecord]]:
        generator, tokenizer = self._model.load()
        sampling = self._model.chunk_sampling(offset)
        episodes = run_episodes(generator, tokenizer, tasks, pool, self.episode_config(), sampling,
                                thinking=self.cfg.thinking, samples=self.cfg.sampling.n)
        by_key = {(ep.task.id, ep.sample): ep for ep in episodes}
        keys = [t.content_key() for t in tasks]  # once a task, not once a sample
        return [[episode_record(by_key[(t.id, s)], keys[i]) for s in range(self.cfg.sampling.n)]
                for i, t in enumerate(tasks)]


def episode_record(ep: Episode, task_key: str | None = None) -> SampleRecord:
    """A sample record of a finished episode: its last solution, verdict, and how it went (``task_key``: its task's
    ``content_key``, given by a caller that records many samples of one task, else computed here)."""
    assistant = [m["content"] for m in ep.messages if m["role"] == "assistant"]
    solutions = [a for a in (parse_action(text, ep.task.kind) for text in assistant) if a.kind == "solution"]
    return SampleRecord(
        id=ep.task.id,
        sample=ep.sample,
        completion="\n\n".join(assistant),
        extracted=solutions[-1].content if solutions else None,
        correct=ep.success,
        score=float(ep.success),
        stage=ep.stop_reason or "unfinished",
        details={"turns": ep.turns, "solutions": ep.solutions, "unsplit": ep.unsplit, "feedback": [
            m["content"] for m in ep.messages if m["role"] == "tool"
        ]},
        truncated=ep.stop_reason == "token_limit",  # the episode's token budget cut it
        shown_pass=bool(ep.verdict) if ep.held_back or ep.unsplit else None,
        held_back_pass=bool(ep.final_verdict) if ep.held_back else None,
        grading=GRADING[ep.task.kind],
        task_key=task_key or ep.task.content_key(),
    )
