"""Reading a model turn's action: which block is taken, where the turn is cut, what counts as none."""

from molrl.episode.actions import parse_action


def test_execute_block_is_code_and_turn_ends_after_it():
    text = "I will test it.\n<execute>\nprint(1)\n</execute>\nObservation: 1"
    action = parse_action(text, "code")
    assert (action.kind, action.content) == ("code", "print(1)")
    assert text[: action.end] == "I will test it.\n<execute>\nprint(1)\n</execute>"


def test_python_fence_is_code():
    action = parse_action("Try:\n```python\nx = 2\nprint(x)\n```\nmore", "code")
    assert (action.kind, action.content, action.raw) == ("code", "x = 2\nprint(x)", "```python\nx = 2\nprint(x)\n```")


def test_solution_block_keeps_its_tags_in_raw_for_the_grader():
    action = parse_action("Done.\n<solution>\ndef f(x):\n    return x\n</solution>", "code")
    assert action.kind == "solution"
    assert action.content == "def f(x):\n    return x"
    assert action.raw == "<solution>\ndef f(x):\n    return x\n</solution>"


def test_first_action_wins():
    text = "<solution>3</solution> then <execute>print(2)</execute>"
    assert parse_action(text, "math").kind == "solution"
    assert parse_action(text[len("<solution>3</solution> then ") :], "math").kind == "code"


def test_fence_inside_solution_belongs_to_the_solution():
    action = parse_action("<solution>\n```python\ndef f():\n    return 1\n```\n</solution>", "code")
    assert action.kind == "solution"


def test_boxed_answer_is_a_math_solution_with_balanced_braces():
    action = parse_action("So the answer is \\boxed{\\frac{1}{2}} indeed.", "math")
    assert (action.kind, action.content, action.raw) == ("solution", "\\frac{1}{2}", "\\boxed{\\frac{1}{2}}")


def test_boxed_is_not_a_solution_for_code_tasks():
    assert parse_action("the result is \\boxed{3}", "code").kind == "none"


def test_unterminated_block_is_no_action_and_says_why():
    action = parse_action("<execute>\nprint(1", "code")
    assert action.kind == "none"
    assert action.problem == "the <execute> block is not closed with </execute>"


def test_actions_inside_a_think_block_are_ignored():
    text = "<think>maybe <execute>print(0)</execute></think>\n<execute>print(1)</execute>"
    action = parse_action(text, "code")
    assert action.content == "print(1)"


def test_plain_text_is_no_action():
    action = parse_action("I am not sure what to do.", "math")
    assert (action.kind, action.problem) == ("none", "no <execute> or <solution> block")
