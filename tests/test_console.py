"""The console: one bar per stage with live figures, no raw Trainer dicts, third-party noise held back."""

from __future__ import annotations

import logging
import warnings

from molrl.logs.console import NOISE, figures_text, format_figure, setup_logging
from molrl.cpu import busy_cores, threads_for


def test_figures_show_the_chosen_keys_with_four_significant_digits():
    logs = {"loss": 0.123456, "reward": 1.0, "grad_norm": 3.0, "kl": float("nan")}
    assert figures_text({"loss": "loss", "reward": "r", "kl": "kl", "absent": "x"}, logs) == "loss 0.1235  r 1  kl -"
    assert format_figure(None) == "-" and format_figure(12345.678) == "1.235e+04"


def test_known_third_party_warnings_are_hidden_unless_verbose():
    root = logging.getLogger()
    saved = (list(root.handlers), root.level)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setup_logging(verbose=False)
        for category, message in NOISE:
            warnings.warn(message.replace(".*", "").replace("\\", "") + " (test)", category)
        warnings.warn("a warning molrl does not know", UserWarning)
    assert [str(w.message) for w in caught] == ["a warning molrl does not know"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        setup_logging(verbose=True)
        category, message = NOISE[0]
        warnings.warn(message.replace(".*", "") + " (test)", category)
    assert len(caught) == 1
    root.handlers[:], root.level = saved


def test_grpo_run_prints_no_raw_log_dicts(tmp_path, capsys):
    from grpo_helpers import save_tiny_model, toy_config
    from molrl.rl.run import run_rl

    out = run_rl(toy_config(tmp_path / "run", save_tiny_model(tmp_path / "base"), max_steps=3))
    printed = capsys.readouterr()
    assert "{'loss'" not in printed.out + printed.err and "'grad_norm'" not in printed.out + printed.err
    assert len((out / "metrics.jsonl").read_text().splitlines()) >= 3  # the figures are in the file instead


def test_busy_cores_from_two_readings():
    # 2 cores; between the readings 300 of 400 jiffies were busy: 1.5 cores busy
    assert busy_cores((1000.0, 5000.0), (1300.0, 5400.0), 2) == 1.5
    assert busy_cores((1.0, 1.0), (1.0, 1.0), 2) == 0.0


def test_threads_follow_idle_cores():
    assert threads_for(idle=2.0, usable=2, most=2) == 2
    assert threads_for(idle=1.0, usable=2, most=2) == 1  # another process holds a core: one thread
    assert threads_for(idle=0.2, usable=2, most=2) == 1  # never fewer than one
    assert threads_for(idle=12.0, usable=4, most=8) == 4  # never more than the cores we may run on


def test_log_lines_go_to_the_stderr_of_the_moment_not_one_closed_since():
    """A handler bound to the stderr of the first stage that ran wrote into a closed stream later ('Logging error'
    and a traceback in the next stage's output, when a test or a caller replaced stderr in between)."""
    import io
    import logging
    import sys

    from molrl.logs.console import CurrentStderrHandler

    handler = CurrentStderrHandler()
    logger = logging.getLogger("molrl.test_current_stderr")
    logger.addHandler(handler)
    logger.propagate = False
    first, second, saved = io.StringIO(), io.StringIO(), sys.stderr
    try:
        sys.stderr = first
        logger.warning("one")
        first.close()
        sys.stderr = second
        logger.warning("two")
    finally:
        sys.stderr = saved
        logger.removeHandler(handler)
    assert second.getvalue() == "two\n"
