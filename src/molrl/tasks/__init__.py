"""Tasks, in one place: the record, the loaders, the single-turn prompts and the grading dispatch.

- ``molrl.task_types`` (a floor below, so that graders and the sandbox read it without this package): ``Task``,
  ``TestCase``, ``JsonlSpec``, the record every stage shares;
- ``molrl.tasks.loaders``: ``load_tasks`` for HumanEval, MBPP, MATH-500, AIME and users' JSONL;
- ``molrl.tasks.asserts``: assert-style tests turned into call tests;
- ``molrl.tasks.prompts``: how a task is posed in one turn (evaluation, RL, the demo);
- ``molrl.tasks.grade``: ``grade(tasks, completions, pool)``, the one dispatch to the graders;
- ``molrl.tasks.splits``: each task's benchmark split, the split a run takes, train/eval overlap;
- ``molrl.tasks.index``: tasks known by content: ``task_content_key`` and ``BenchmarkIndex``;
- ``molrl.tasks.held_out``: which tests a task shows and which decide its verdict;
- ``molrl.tasks.toy``: the toy task that checks an RL loop end to end.

Modules of this package import only ``molrl.task_types`` and ``molrl.graders``, never a stage.
"""

from molrl.tasks.loaders import load_tasks
from molrl.task_types import JsonlSpec, Task, TestCase

__all__ = ["JsonlSpec", "Task", "TestCase", "load_tasks"]
