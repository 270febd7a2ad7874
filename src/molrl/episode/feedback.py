"""Feedback providers: turn what the environment observed into the words of a ``tool`` message.

After each model turn the loop records an ``Observation`` (the action taken, the sandbox result,
the test outcomes, the verdict, the budget left). Each provider reads it and returns a piece of
text or ``None``; the feedback message is the pieces joined by blank lines. The built-in providers
are pure functions of the observation, so every feedback message in a trace can be re-derived
from the sandbox results recorded beside it (``render_feedback``). A provider that asks another
model (``molrl.episode.critique``) gets the conversation too; its text is recorded as it came.

Add a provider without touching the loop: any object with a ``name`` and a
``__call__(task, observation, messages) -> str | None``, named in the config as
``"package.module:factory"`` (called with the ``EpisodeConfig``) or passed to ``run_episodes``.

Quoted program text is made visible and clipped in tokens of the run's tokenizer
(``molrl.episode.quote``); every piece, a custom provider's too, has its control characters, bidi
overrides and lone surrogates escaped before it joins the message.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Protocol, Sequence

from molrl.episode.quote import Spans, clip, visible
from molrl.tasks import Task

NO_FEEDBACK = "[no feedback]"
"""The tool message when every provider stays silent (a message is never empty)."""


@dataclass
class Observation:
    """What the environment saw after one model turn; recorded in the trace meta."""

    action: str
    """``code`` (ran in the sandbox), ``solution`` (graded) or ``none`` (no complete action)."""
    problem: str = ""
    """For ``none``: why no action was taken."""
    exec: dict[str, Any] | None = None
    """For ``code``: the sandbox result (status, exit_code, stdout, stderr, truncated, duration_s)."""
    grade: dict[str, Any] | None = None
    """The grader's ``Grade`` (as a dict) for a solution, or for executed code that was tested."""
    verdict: bool | None = None
    """For ``solution``: whether it is correct."""
    turns_left: int = 0
    """Model turns left after this one."""
    solutions_left: int = 0
    """Solution submissions left after this one."""
    final: bool = False
    """Whether the episode ends with this feedback."""

    def to_dict(self) -> dict[str, Any]:
        """The JSON-ready record."""
        return asdict(self)

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> "Observation":
        """Rebuild from ``to_dict`` output."""
        return cls(**record)


class FeedbackProvider(Protocol):
    """Turns an observation into feedback text, or ``None`` when it has nothing to say."""

    name: str

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        """Feedback for the turn that ended ``messages`` (the last message is the model's turn)."""
        ...


QUOTE_TOKENS = 96
"""Most tokens of one quoted input, output, value or test source in a failed test's description."""


def quote(text: str, limit: int, keep: str = "head", spans: Spans | None = None) -> str:
    """Program text as feedback shows it: hidden characters escaped, then clipped to ``limit`` tokens."""
    return clip(visible(text), limit, keep, spans)


@dataclass
class ExecutionFeedback:
    """What running the code printed: stdout, and the error or traceback when it failed."""

    max_tokens: int = 512
    """Most tokens shown from each stream, marker included (stdout keeps its head, a traceback its tail)."""
    spans: Spans | None = None
    """Token spans under the run's tokenizer (``quote.token_spans``); None counts UTF-8 bytes."""
    name: str = "execution"

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        result = obs.exec
        if result is None:
            return None
        stdout, stderr, status = result["stdout"], result["stderr"], result["status"]
        parts = []
        if stdout:
            parts.append("Output:\n" + quote(stdout.rstrip("\n"), self.max_tokens, spans=self.spans))
        if status == "ok":
            if not parts:
                parts.append("The code ran without error and printed nothing.")
        elif status == "timeout":
            parts.append(f"Execution timed out after {result['duration_s']:.1f} s and was stopped.")
        elif status == "memory_limit":
            parts.append("Execution ran out of memory and was stopped.")
        elif status == "output_limit":
            parts.append("Execution printed too much output and was stopped.")
        else:
            error = stderr.rstrip("\n") or f"the process exited with code {result['exit_code']}"
            parts.append("Error:\n" + quote(error, self.max_tokens, keep="tail", spans=self.spans))
        if result.get("truncated"):
            parts.append("(The output was longer than the sandbox keeps; the rest was not captured.)")
        return "\n".join(parts)


@dataclass
class TestFeedback:
    """Test results in words: which tests failed and how (code tasks)."""

    __test__ = False  # not a pytest test class

    max_failures: int = 3
    """Most failing tests described; the rest are counted."""
    max_tokens: int = 512
    """Most tokens of a crash's error output quoted, marker included."""
    spans: Spans | None = None
    """Token spans under the run's tokenizer (``quote.token_spans``); None counts UTF-8 bytes."""
    name: str = "tests"

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        grade = obs.grade
        if task.kind != "code" or grade is None:
            return None
        stage, details = grade["stage"], grade["details"]
        if stage == "no_code":
            return "No code was found in the solution."
        if stage == "compile_error":
            return f"The code does not compile: {details['error']}"
        if stage == "sandbox_error":
            return f"The tests could not be run: the sandbox failed ({details.get('error')})."
        if stage == "grader_error":
            return f"The tests could not be judged: grading failed ({details.get('error')})."
        total, passed = details["total"], details["passed"]
        if total and passed == total:
            return f"All {total} tests passed." if total > 1 else "The test passed."
        lines = [f"{total - passed} of {total} tests failed:"]
        failures = [t for t in details["tests"] if not t["passed"]]
        lines += ["- " + describe_failure(task, t, self.spans) for t in failures[: self.max_failures]]
        if len(failures) > self.max_failures:
            lines.append(f"(and {len(failures) - self.max_failures} more)")
        crashed = details["status"] not in ("ok", "runtime_error") or (passed == 0 and details.get("stderr_tail"))
        if crashed and obs.exec is None:  # executed code already showed its own error output
            crash = details.get("stderr_tail") or details["status"]
            lines.append(f"The run ended with status {details['status']}:\n"
                         + quote(crash.rstrip("\n"), self.max_tokens, keep="tail", spans=self.spans))
        return "\n".join(lines)


def describe_failure(task: Task, outcome: dict[str, Any], spans: Spans | None = None) -> str:
    """One failed test in words, e.g. ``f(3) returned 7, expected 9`` (quotes clipped in ``spans`` tokens)."""
    test = task.tests[outcome["index"]]
    error = quote(str(outcome["error"]), QUOTE_TOKENS, spans=spans) if outcome["error"] else outcome["error"]
    if test.kind == "call":
        args = test.args_source.strip()[1:-1].rstrip(", ") if test.args_source else ", ".join(map(repr, test.args))
        call = f"{task.entry_point}({args})"
        if outcome["error"] == "wrong answer":
            return f"{call} returned {_shown(outcome['got'], spans)}, expected {test.expected!r}"
        return f"{call} failed: {error}"
    if test.kind == "stdio":  # quoted with repr, which escapes every character that does not print
        stdin = clip(test.stdin, QUOTE_TOKENS, spans=spans)
        if outcome["error"] == "wrong output":
            got, expected = (clip(text, QUOTE_TOKENS, spans=spans) for text in (outcome["got"] or "", test.stdout))
            return f"with input {stdin!r} the program printed {got!r}, expected {expected!r}"
        return f"with input {stdin!r}: {error}"
    return f"{quote(test.source.strip(), QUOTE_TOKENS, spans=spans)} failed: {error or 'assertion failed'}"


def _shown(encoded: Any, spans: Spans | None) -> str:
    """A returned value as Python would print it (it comes back encoded with its exact type)."""
    from molrl.sandbox.runtime.codec import decode

    try:
        return quote(repr(decode(encoded)), QUOTE_TOKENS, spans=spans)
    except (ValueError, TypeError, KeyError, OverflowError):
        return quote(str(encoded), QUOTE_TOKENS, spans=spans)


@dataclass
class VerdictFeedback:
    """Whether a submitted solution is correct."""

    name: str = "verdict"

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        if obs.action != "solution":
            return None
        what = "answer" if task.kind == "math" else "solution"
        if obs.verdict:
            return f"Your {what} is correct."
        if task.kind == "math" and obs.grade and obs.grade["stage"] == "no_answer":
            return "No final answer could be read from your solution; your answer is counted as wrong."
        return f"Your {what} is wrong."


@dataclass
class FormatFeedback:
    """Why nothing was run or graded when a turn had no complete action, and what to write."""

    name: str = "format"

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        if obs.action != "none":
            return None
        return (
            f"No action was taken: {obs.problem}. End your turn with code to run in "
            "<execute>...</execute>, or your final solution in <solution>...</solution>."
        )


@dataclass
class BudgetFeedback:
    """How many turns and solution submissions are left (not said once the episode is over)."""

    name: str = "budget"

    def __call__(self, task: Task, obs: Observation, messages: Sequence[dict[str, str]]) -> str | None:
        if obs.final:
            return None
        turns = f"{obs.turns_left} turn{'s' if obs.turns_left != 1 else ''}"
        subs = f"{obs.solutions_left} solution submission{'s' if obs.solutions_left != 1 else ''}"
        return f"You have {turns} and {subs} left."


def render_feedback(
    providers: Sequence[FeedbackProvider], task: Task, obs: Observation, messages: Sequence[dict[str, str]]
) -> tuple[str, dict[str, str]]:
    """The feedback message and each provider's piece of it (providers that said nothing are absent)."""
    pieces: dict[str, str] = {}
    for provider in providers:
        text = provider(task, obs, messages)
        if text:
            pieces[provider.name] = visible(text)
    return ("\n\n".join(pieces.values()) or NO_FEEDBACK), pieces


def rederive_feedback(
    messages: Sequence[dict[str, str]], observations: dict[str, dict[str, Any]], task: Task,
    providers: Sequence[FeedbackProvider],
) -> dict[int, str]:
    """Each tool message's text derived again from its recorded observation (``meta['observations']``).

    Remote providers (a critic) are not asked again: their recorded pieces are reused.
    """
    derived = {}
    for key, record in observations.items():
        i = int(key)
        obs = Observation.from_dict(record["observation"])
        pieces = []
        for provider in providers:
            if getattr(provider, "remote", False):
                pieces.append(record["feedback"].get(provider.name))
            else:
                pieces.append(provider(task, obs, messages[:i]))
        derived[i] = "\n\n".join(visible(p) for p in pieces if p) or NO_FEEDBACK
    return derived
