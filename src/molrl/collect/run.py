"""``run_collect``: the loop plus persistence — resumable, lossless, with a progress bar.

Every episode is appended to ``output_dir/traces.jsonl`` (one atomic line, fsynced) the moment it ends, so a
Ctrl-C or kill -9 loses only the episodes in flight. On start the file is read and the
``(task_id, sample)`` pairs already there are skipped. An episode that produced no valid trace
(its first turn was empty), or whose trace cannot be written as JSON, goes to
``traces.rejects.jsonl`` with the reason, so it is counted and not retried forever. An episode the sandbox stopped
(``sandbox_error``) is never a trace: its feedback says the sandbox failed, which teaches nothing true; it goes to the
rejects file too, is counted apart, and is collected again when the run resumes; past ``sandbox.max_error_rate`` of
the run's episodes the run stops. Text never
stops a run: a lone surrogate a program printed or returned is written as a JSON escape. The resolved config is
written to ``config.yaml`` (``molrl.collect.files``: a run made before, as one trace file, resumes where it lies);
resuming with
settings that change what a trace means (model, tasks, sampling, feedback...) is refused, and a
finished file says so and is left as it is (``molrl.records.rerun``: the rule every stage follows).
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any, Sequence

from molrl.collect.config import CollectConfig
from molrl.collect.files import CollectFiles, collect_files
from molrl.episode.loop import Episode, run_episodes
from molrl.config import check_values, to_dict
from molrl.cpu import use_threads
from molrl.errors import DataError, MolrlError
from molrl.records.jsonl import json_line, read_lines, repair_torn_tail
from molrl.records.rerun import NEW_RUN, check_rerun, save_run_config, say_finished
from molrl.records.run_inputs import model_fingerprints
from molrl.tasks import Task
from molrl.traces.schema import TraceError, append_trace, read_traces
from molrl.records.locks import folder_lock
from molrl.records.writes import append_text
from molrl.sandbox.errors import ErrorCount

log = logging.getLogger(__name__)

SANDBOX_STOP = "the sandbox failed, so the episode's feedback is no verdict on it"
"""The reason a rejects record gives for an episode the sandbox stopped."""


def run_collect(cfg: CollectConfig, *, generator: Any = None, tokenizer: Any = None,
                tasks: Sequence[Task] | None = None) -> Path:
    """Collect traces for every (task, sample) not yet in ``cfg.output_dir``; returns the trace file.

    ``generator`` and ``tokenizer`` replace the ones ``cfg.model.path`` would load (e.g. a model already
    in memory); ``tasks`` replaces the task file (tasks held in memory, whose sandbox setup a task
    file cannot carry).
    """
    check_values(cfg, "CollectConfig")
    files = collect_files(Path(cfg.output_dir))
    out = files.traces
    if files.before:
        log.info("%s: a trace file made before collect wrote into output_dir; resuming it where it lies", out)
    # one run at a time in an output folder, and one stage's run in it (molrl.records.locks.folder_lock: freed if killed);
    # a trace file of the layout before output_dir lies beside other things, in a folder that is not the run's
    own = out.parent == Path(cfg.output_dir)
    with folder_lock(out.parent, f"use another {NEW_RUN['collect']}", stage="collect" if own else None):
        return _collect(cfg, files, generator, tokenizer, tasks)


def _collect(cfg: CollectConfig, files: CollectFiles, generator: Any, tokenizer: Any,
             tasks: Sequence[Task] | None) -> Path:
    from molrl.tasks.source import load_task_source

    out = files.traces
    done = finished_pairs(files)
    check_rerun("collect", cfg, files.config, started=bool(done), run=out)  # molrl.records.rerun: one rule for every stage
    if tasks is None:
        tasks = load_task_source(cfg.data, "data")  # its training split unless data.split names another
    pairs = [(t.id, s) for t in tasks for s in range(cfg.sampling.n)]
    total, todo = len(pairs), sum(pair not in done for pair in pairs)
    if todo == 0:
        say_finished(out, f"all {total} episodes collected", "collect")
        return out
    log.info("%s: %d of %d episodes already collected, %d to go", out, total - todo, total, todo)
    save_run_config("collect", cfg, files.config)
    if cfg.sampling.n > 1 and cfg.sampling.temperature == 0:
        log.warning("sampling.n=%d with greedy decoding (temperature 0): the episodes of a task will mostly repeat; "
                    "set sampling.temperature", cfg.sampling.n)
    use_threads(cfg.threads, "collect")
    own = generator is None or tokenizer is None  # made here: released here (a vLLM engine's memory)
    if own:
        from molrl.engines.builder import open_generator

        work = todo * cfg.episode.max_turns * cfg.sampling.max_new_tokens  # most tokens the episodes generate
        generator, tokenizer = open_generator("collect", cfg, work, batch_size=cfg.episode.batch_size)
    try:
        _run(cfg, files, generator, tokenizer, tasks, pairs, done, total)
    finally:
        if own and hasattr(generator, "close"):
            generator.close()
    return out


def _run(cfg: CollectConfig, files: CollectFiles, generator: Any, tokenizer: Any, tasks: Sequence[Task], pairs: Any,
         done: Any, total: int) -> None:
    """Run the episodes left and append each finished one to the trace file."""
    from molrl.sandbox import SandboxPool

    settings = generation_settings(cfg, generator)
    stats = _Stats()
    for pair in pairs:
        if pair in done:
            stats.add(*done[pair])
    errors = ErrorCount(cfg.sandbox.max_error_rate, "collect")  # this run's episodes the sandbox stopped
    with _Progress(cfg.progress, total, stats) as advance, SandboxPool(cfg.sandbox) as pool:

        def save(ep: Episode) -> None:
            stats.rejected += not write_episode(files, ep, settings)
            if ep.stop_reason == "sandbox_error":
                stats.sandbox_errors += 1
            else:
                stats.add(ep.success, ep.turns)
            advance()
            errors.add(int(ep.stop_reason == "sandbox_error"), 1)

        run_episodes(generator, tokenizer, tasks, pool, cfg.episode, cfg.sampling, thinking=cfg.thinking,
                     samples=cfg.sampling.n, skip=done, on_finish=save)
    log.info("%s: %d episodes, success rate %.3f, mean turns %.2f%s", files.traces, stats.done, stats.rate,
             stats.mean_turns, f"; {stats.sandbox_errors} dropped at a sandbox error" if stats.sandbox_errors else "")
    if stats.rejected:
        log.warning("%s: %d episodes of this run have no trace (%d stopped by a sandbox error, collected again when "
                    "the run resumes); their reasons are in %s", files.traces, stats.rejected, stats.sandbox_errors,
                    files.rejects)


def write_episode(files: CollectFiles, ep: Episode, settings: dict[str, Any]) -> bool:
    """Append the episode's trace to the trace file (True), or its reason to the rejects file (False) when the sandbox
    stopped it (``SANDBOX_STOP``), it has no valid trace or it cannot be written as JSON."""
    trace = ep.to_trace(settings)
    if ep.stop_reason == "sandbox_error":
        reason = f"{SANDBOX_STOP}: {sandbox_failure(ep)}"
    else:
        try:
            append_trace(files.traces, trace)
            return True
        except TraceError as err:
            reason = str(err)
        except (TypeError, ValueError, RecursionError) as err:  # a value JSON cannot hold, in the meta
            reason = f"the trace cannot be written as JSON ({type(err).__name__}: {err})"
    record = {"task_id": ep.task.id, "sample": ep.sample, "error": reason, "stop_reason": ep.stop_reason, "meta": trace.meta}
    try:
        line = json_line(record)
    except (TypeError, ValueError, RecursionError):  # the same value: keep what resuming needs
        line = json_line(dict(record, meta={"turns": ep.turns, "success": ep.success}))
    _append_line(files.rejects, line)
    return False


def sandbox_failure(ep: Episode) -> str:
    """What the sandbox said when it stopped ``ep``: the error of its last observation."""
    last = ep.observations[max(ep.observations)]["observation"] if ep.observations else {}
    return str((last.get("exec") or {}).get("error") or ((last.get("grade") or {}).get("details") or {}).get("error"))


def finished_pairs(files: CollectFiles) -> dict[tuple[str, int], tuple[bool, int]]:
    """``(task_id, sample)`` pairs already in the trace file or the rejects file, each with (success, turns); an
    episode the sandbox stopped is not finished (it is collected again)."""
    out = files.traces
    done: dict[tuple[str, int], tuple[bool, int]] = {}
    if out.exists():
        repair_torn_tail(out)
        reader = read_traces(out)
        for line, trace in reader:
            key = (trace.meta.get("task_id"), trace.meta.get("sample"))
            if key in done:
                raise MolrlError(f"{out}:{line}: task {key[0]} sample {key[1]} appears twice; remove one of the lines")
            done[key] = (bool(trace.success), int(trace.meta.get("turns", 0)))  # type: ignore[index]
        if reader.rejects:
            raise MolrlError(f"{reader.rejects[0]} (fix or delete the line, then re-run to resume)")
    rejects = files.rejects
    if rejects.exists():
        repair_torn_tail(rejects)
        for line in read_lines(rejects):
            try:
                record = line.json()
                if record.get("stop_reason") == "sandbox_error":
                    continue
                done[(record["task_id"], record["sample"])] = (False, int(record["meta"].get("turns", 0)))
            except (DataError, KeyError, TypeError, AttributeError):
                raise MolrlError(f"{rejects}:{line.number}: not a rejected-episode record; fix or delete the line") from None
    return done


def _append_line(path: Path, line: str) -> None:
    append_text(path, line + "\n", sync=True)


def generation_settings(cfg: CollectConfig, generator: Any) -> dict[str, Any]:
    """What produced the traces: model, adapter (each with its fingerprint), the engine ``generator`` runs on, sampling
    and rendering settings."""
    return {
        "model": cfg.model.path,
        "adapter": to_dict(cfg.model.adapter),
        "model_fingerprint": model_fingerprints("collect", cfg),
        "engine": getattr(generator, "engine", cfg.engine),  # the engine chosen, not auto; a caller's own: as asked
        "dtype": cfg.model.dtype,
        "sampling": to_dict(cfg.sampling),
        "enable_thinking": cfg.thinking,
        "max_turns": cfg.episode.max_turns,
        "max_solutions": cfg.episode.max_solutions,
        "max_total_tokens": cfg.episode.max_total_tokens,
        "feedback": list(cfg.episode.feedback),
        "seed": cfg.sampling.seed,
    }


class _Stats:
    """Running totals for the progress bar."""

    def __init__(self) -> None:
        self.done = self.successes = self.turns = 0
        self.rejected = 0  # episodes of this run that went to the rejects file
        self.sandbox_errors = 0  # of them, episodes the sandbox stopped (no verdict: not in done or the rate)

    def add(self, success: bool, turns: int) -> None:
        """Count one finished episode."""
        self.done += 1
        self.successes += success
        self.turns += turns

    @property
    def rate(self) -> float:
        return self.successes / self.done if self.done else 0.0

    @property
    def mean_turns(self) -> float:
        return self.turns / self.done if self.done else 0.0


class _Progress:
    """One progress bar over episodes showing success rate and mean turns (a no-op when off)."""

    def __init__(self, enabled: bool, total: int, stats: _Stats):
        self.enabled, self.total, self.stats = enabled, total, stats
        self._stack = contextlib.ExitStack()
        self._bar: Any = None

    def __enter__(self):
        if self.enabled:
            from molrl.logs.console import stage_bar

            self._bar = self._stack.enter_context(stage_bar("collect", self.total, self.stats.done))
            self.advance()
        return self.advance

    def advance(self) -> None:
        if self._bar is not None:
            figures = f"solved {self.stats.rate:.1%}  turns {self.stats.mean_turns:.2f}"
            self._bar.update(completed=self.stats.done + self.stats.sandbox_errors, figures=figures)

    def __exit__(self, *exc: Any) -> None:
        self._stack.close()
