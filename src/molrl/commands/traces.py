"""``molrl traces``: convert, inspect and filter multi-turn traces.

  molrl traces convert --from mint|openai|tora IN OUT [--rejects FILE] [--strict] [--strip-example]
                       [--benchmarks NAME=PATH,...]
  molrl traces stats FILE... --tokenizer PATH [--benchmarks NAME=PATH,...]
  molrl traces show FILE --tokenizer PATH [--index N] [--html OUT]
  molrl traces lint FILE...
  molrl traces filter IN OUT [--success-only] [--min-feedback-turns N] [--kind domain|general]
                       [--exclude-benchmarks NAME=PATH,...] [--drop-model-feedback]

``--benchmarks`` and ``--exclude-benchmarks`` name benchmark files (mbpp, humaneval, math500, aime24, aime25)
that traces are matched against by their task's content (``molrl.tasks.index``), whatever ids they carry.

IN may be a file or a directory of ``*.jsonl`` files. Bad records are counted, listed and written
to a rejects file (default ``OUT.rejects.jsonl``), never dropped silently; ``--strict`` stops
instead, listing them.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from molrl.cli import count, natural
from molrl.errors import DataError, MolrlError
from molrl.records.locks import file_lock, folder_lock
from molrl.records.writes import write_text

log = logging.getLogger("molrl.traces")
_SHOWN_REJECTS = 10
CONVERT_FORMATS = """input formats (one JSON object per line):
  mint    MINT results.jsonl rows {task, state: {history, success, ...}}: later user turns
          (Observation:, Expert feedback:) become tool messages
  openai  {"messages": [{role, content}, ...], ...}: roles pass through (--map-role for others)
  tora    ToRA tool-integrated completions: the ToRA corpus {"messages": [...], "id", "gt"} or
          ToRA's inference outputs {"idx", "question", "code": [completion, ...], "pred", ...}
          (one trace per completion); each ```output block's content becomes a tool message
          and the text and ```python code around it assistant turns
"""


def register(subparsers: Any) -> None:
    """Add ``molrl traces`` and its subcommands."""
    parser = subparsers.add_parser("traces", help="convert, inspect and filter multi-turn traces")
    sub = parser.add_subparsers(dest="traces_command", metavar="SUBCOMMAND")
    parser.set_defaults(func=lambda args: parser.print_help() or 2)

    p = sub.add_parser("convert", help="import MINT, OpenAI-style or ToRA traces into the molrl format",
                       description=CONVERT_FORMATS, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--from", dest="fmt", choices=["mint", "openai", "tora"], required=True, help="input format (see above)")
    p.add_argument("input", type=Path, metavar="IN", help="input .jsonl file or directory of them")
    p.add_argument("output", type=Path, metavar="OUT", help="output file (or directory when IN is one)")
    _add_reject_args(p)
    p.add_argument("--map-role", action="append", default=[], metavar="FROM=TO",
                   help="openai: map an extra role name, e.g. function=tool (repeatable)")
    p.add_argument("--drop-key", action="append", default=[], metavar="KEY",
                   help="openai: discard this message key, e.g. name (repeatable)")
    p.add_argument("--strip-example", action="store_true",
                   help="mint: remove MINT's in-context example (a solved task) from each prompt")
    _add_benchmark_arg(p, "--benchmarks", "tag each trace with the benchmark task it is (meta.benchmark_task)")
    p.set_defaults(func=run_convert)

    p = sub.add_parser("stats", help="per-file counts of traces, turns and tokens by role")
    p.add_argument("files", type=Path, nargs="+", metavar="FILE", help="trace files")
    _add_tokenize_args(p)
    p.add_argument("--json", type=Path, default=None, metavar="OUT", help="also write the counts as JSON")
    _add_benchmark_arg(p, "--benchmarks", "also count the traces (and tasks) of each benchmark and split")
    p.set_defaults(func=run_stats)

    p = sub.add_parser("show", help="print a trace with every token coloured by role")
    p.add_argument("file", type=Path, metavar="FILE", help="trace file")
    p.add_argument("--index", type=natural, default=0, metavar="N", help="which valid trace in the file (0-based)")
    p.add_argument("--html", type=Path, default=None, metavar="OUT", help="write the coloured trace as an HTML page")
    _add_tokenize_args(p)
    p.set_defaults(func=run_show)

    p = sub.add_parser("lint", help="per-file counts of decision turns that write the environment's reply "
                                    "themselves (molrl.traces.lint)")
    p.add_argument("files", type=Path, nargs="+", metavar="FILE", help="trace files or directories of them")
    p.set_defaults(func=run_lint)

    p = sub.add_parser("filter", help="select traces for a training set")
    p.add_argument("input", type=Path, metavar="IN", help="trace file or directory of them")
    p.add_argument("output", type=Path, metavar="OUT", help="output trace file")
    p.add_argument("--success-only", action="store_true", help="keep only traces with meta.success true")
    p.add_argument("--min-feedback-turns", type=natural, default=0, metavar="N", help="keep traces with >= N tool messages")
    p.add_argument("--kind", choices=["domain", "general"], default=None, help="keep only this meta.kind")
    _add_benchmark_arg(p, "--exclude-benchmarks", "drop the traces whose task is one of these benchmarks' test tasks "
                                                 "(the ones eval scores)")
    p.add_argument("--drop-model-feedback", action="store_true",
                   help="drop the traces with a decision turn that writes the environment's reply itself after its "
                        "action (Observation:, Output:; see molrl traces lint)")
    _add_reject_args(p)
    p.set_defaults(func=run_filter)


def _add_benchmark_arg(p: argparse.ArgumentParser, flag: str, what: str) -> None:
    p.add_argument(flag, default=None, metavar="NAME=PATH,...",
                   help=f"benchmark files, e.g. mbpp=data/mbpp.jsonl,humaneval=data/HumanEval.jsonl.gz: {what}")


def benchmark_index(spec: str | None, flag: str) -> Any:
    """The ``BenchmarkIndex`` of a ``NAME=PATH,...`` option, None when it is not given."""
    from molrl.tasks.index import BenchmarkIndex, parse_benchmarks

    return BenchmarkIndex.from_files(parse_benchmarks(spec, flag)) if spec is not None else None


def _add_reject_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--rejects", type=Path, default=None, metavar="FILE",
                   help="where bad records go (default OUT.rejects.jsonl, written only if there are any)")
    p.add_argument("--strict", action="store_true", help="stop at the first bad record")


def _add_tokenize_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tokenizer", "--model", dest="tokenizer", required=True, metavar="PATH",
                   help="tokenizer (or model) directory whose chat template renders the traces")
    p.add_argument("--max-length", type=count, default=None, metavar="N", help="token limit (default none)")
    p.add_argument("--truncation", choices=["drop", "truncate"], default="drop", help="what happens over --max-length")
    p.add_argument("--no-thinking", action="store_true", help="render with enable_thinking=false")
    p.add_argument("--empty-think-is-decision", action="store_true", help="count empty think blocks as decision tokens")


def _tokenize_config(args: argparse.Namespace):
    from molrl.traces.tokenize import TokenizeConfig

    return TokenizeConfig(
        max_length=args.max_length,
        truncation=args.truncation,
        enable_thinking=not args.no_thinking,
        empty_think_is_decision=args.empty_think_is_decision,
        require_feedback=False,
    )


def load_tokenizer(path: str) -> Any:
    """A tokenizer with a chat template from a local directory (or a model id already cached)."""
    from transformers import AutoTokenizer

    from molrl.models import check_tokenizer_folder

    check_tokenizer_folder(path)  # a folder without tokenizer files would load as an empty tokenizer
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError) as err:
        raise MolrlError(f"{path}: cannot load a tokenizer ({err}); pass a tokenizer or model directory") from None
    if getattr(tok, "chat_template", None) is None:
        raise MolrlError(f"{path}: tokenizer has no chat_template; use an instruct/chat model's tokenizer")
    return tok


def input_files(path: Path) -> list[Path]:
    """``path`` itself, or the ``*.jsonl`` files in it when it is a directory."""
    if path.is_dir():
        files = sorted(p for p in path.glob("*.jsonl") if not p.name.endswith(".rejects.jsonl"))
        if not files:
            raise MolrlError(f"{path}: no .jsonl files in this directory")
        return files
    if not path.exists():
        raise MolrlError(f"{path}: no such file or directory")
    return [path]


def _report_rejects(rejects: list, out: Path | None, explicit: Path | None) -> None:
    from molrl.traces.schema import write_jsonl

    for r in rejects[:_SHOWN_REJECTS]:
        log.warning("rejected %s", r)
    if len(rejects) > _SHOWN_REJECTS:
        log.warning("... and %d more rejected records", len(rejects) - _SHOWN_REJECTS)
    target = explicit or (Path(str(out) + ".rejects.jsonl") if rejects and out is not None else None)
    if target is not None:
        write_jsonl(target, (r.to_dict() for r in rejects))
        log.info("%d rejected records written to %s", len(rejects), target)


def run_convert(args: argparse.Namespace) -> int:
    """Convert MINT/OpenAI/ToRA files into molrl trace files, reporting every rejected record."""
    with _output_held(args.output, folder=args.input.is_dir()):
        return _convert(args)


def _output_held(output: Path, folder: bool) -> Any:
    """The lock of a command's output (``molrl.records.locks``: one run at a time in an output folder, of any stage)."""
    return (folder_lock if folder else file_lock)(output, "give another OUT")


def _convert(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from collections import Counter

    from molrl.traces.importers import OpenAIOptions, import_file
    from molrl.traces.schema import rejects_error, write_traces

    if args.strip_example and args.fmt != "mint":
        raise MolrlError(f"--strip-example removes MINT's in-context example; --from {args.fmt} has none: "
                         "drop the flag")
    options = OpenAIOptions(role_map=_parse_role_map(args.map_role), drop_keys=tuple(args.drop_key))
    files = input_files(args.input)
    index = benchmark_index(args.benchmarks, "--benchmarks")
    table = Table(title=f"traces convert --from {args.fmt}")
    table.add_column("file", overflow="fold")
    table.add_column("converted")
    table.add_column("rejected")
    if index is not None:
        table.add_column("benchmark tasks (traces)")
    rejects = []
    for path in files:
        result = import_file(path, args.fmt, options, strip_example=args.strip_example, index=index)
        if args.strict and result.rejects:
            raise rejects_error(result.rejects)  # every bad record of the file, one line each
        if result.rejects and not result.traces:  # nothing to write: most likely a file in another format
            reason, _ = Counter(r.reason for r in result.rejects).most_common(1)[0]
            line = next(r.line for r in result.rejects if r.reason == reason)
            raise MolrlError(f"{path}: none of its {len(result.rejects)} records converted with --from {args.fmt}; "
                             f"line {line}: {reason}")
        target = args.output / path.name if args.input.is_dir() else args.output
        write_traces(target, (t for _, t in result.traces))
        matched = [] if index is None else [_matched_label(t.meta) for _, t in result.traces]
        table.add_row(path.name, str(len(result.traces)), str(len(result.rejects)),
                      *([_label_counts(matched)] if index is not None else []))
        rejects += result.rejects
    Console().print(table)
    _report_rejects(rejects, args.output, args.rejects)
    return 0


def _matched_label(meta: dict[str, Any]) -> str | None:
    found = meta.get("benchmark_task")
    return f"{found['benchmark']}/{found['split']}" if found else None


def _label_counts(labels: list[str | None]) -> str:
    """``mbpp/test 91, humaneval/test 45`` of the matched labels; ``none`` when there are none."""
    from collections import Counter

    counts = Counter(label for label in labels if label)
    return ", ".join(f"{label} {n}" for label, n in sorted(counts.items())) or "none"


def _parse_role_map(items: list[str]) -> dict[str, str]:
    mapping = {}
    for item in items:
        src, sep, dst = item.partition("=")
        if not sep or dst not in ("system", "user", "assistant", "tool"):
            raise MolrlError(f"--map-role {item!r}: expected FROM=TO with TO one of system/user/assistant/tool")
        mapping[src] = dst
    return mapping


def run_stats(args: argparse.Namespace) -> int:
    """Print per-file counts of traces, turns and tokens by role under the tokenizer's template."""
    import json

    from rich.console import Console

    from molrl.commands.trace_tables import overlap_table, stats_table
    from molrl.traces.stats import file_stats, total

    tokenizer = load_tokenizer(args.tokenizer)
    cfg = _tokenize_config(args)
    stats = [file_stats(p, tokenizer, cfg) for f in args.files for p in input_files(f)]
    Console(width=200).print(stats_table(stats, args.tokenizer))
    index = benchmark_index(args.benchmarks, "--benchmarks")
    if index is not None:
        from molrl.traces.stats import benchmark_overlap

        overlaps = [benchmark_overlap(p, index) for f in args.files for p in input_files(f)]
        Console(width=200).print(overlap_table(overlaps, index.names))
    _report_rejects(total(stats).reject_reasons, None, None)
    if args.json:
        write_text(args.json, json.dumps([s.to_dict() for s in stats + [total(stats)]], indent=1))
    return 0


def run_show(args: argparse.Namespace) -> int:
    """Print one trace coloured by token role; optionally write it as an HTML page."""
    from rich.console import Console

    from molrl.traces.display import legend_rich, to_html, to_rich
    from molrl.traces.schema import TraceError, read_traces
    from molrl.traces.tokenize import tokenize_trace

    tokenizer = load_tokenizer(args.tokenizer)
    reader = read_traces(args.file)
    found = next((item for i, item in enumerate(reader) if i == args.index), None)
    if found is None:
        raise MolrlError(f"{args.file}: no valid trace at index {args.index} ({len(reader.rejects)} rejected records)")
    line_no, trace = found
    for reject in reader.rejects:  # the bad records before it, which the index skipped
        log.warning("skipped %s", reject)
    try:
        tokenized = tokenize_trace(trace, tokenizer, _tokenize_config(args))
    except TraceError as err:
        raise DataError(str(args.file), line_no, str(err)) from None
    console = Console()
    console.print(legend_rich())
    console.print(to_rich(tokenized, tokenizer))
    console.print(
        f"{args.file}:{line_no}: {tokenized.n_tokens} tokens = {tokenized.n_prompt} prompt + {tokenized.n_decision} "
        f"decision + {tokenized.n_feedback} feedback + {tokenized.n_template} template", highlight=False,
        soft_wrap=True)  # one line however long the path: file:line stays whole to copy
    for note in tokenized.notes:
        log.warning("%s:%d: %s", args.file, line_no, note)
    if args.html:
        write_text(args.html, to_html(tokenized, tokenizer, f"{args.file.name}:{line_no}"))
        log.info("wrote %s", args.html)
    return 0


def run_lint(args: argparse.Namespace) -> int:
    """Print per-file counts of the decision turns that write the environment's reply themselves, and name the
    first of them."""
    from rich.console import Console

    from molrl.commands.trace_tables import lint_table
    from molrl.traces.lint import MAX_SHOWN, lint_file

    counts = [lint_file(p) for f in args.files for p in input_files(f)]
    table, total = lint_table(counts)
    Console(width=200).print(table)
    firsts = [c.examples[0] for c in counts if c.examples]  # one a file, so every file that holds one is named
    for example in firsts[:MAX_SHOWN]:
        log.warning("%s", example)
    if total.model_feedback_turns > len(firsts[:MAX_SHOWN]):
        log.warning("... and %d more such turns", total.model_feedback_turns - len(firsts[:MAX_SHOWN]))
    if total.model_feedback_traces:
        log.info("these turns train as decision tokens; `molrl traces filter IN OUT --drop-model-feedback` leaves "
                 "their traces out")
    _report_rejects([r for c in counts for r in c.rejects], None, None)
    return 0


def run_filter(args: argparse.Namespace) -> int:
    """Keep the traces that pass every condition; report how many each condition removed."""
    with _output_held(args.output, folder=False):
        return _filter(args)


def _filter(args: argparse.Namespace) -> int:
    from collections import Counter

    from molrl.traces.schema import read_traces, write_traces

    from molrl.tasks.index import EVAL_SPLIT, overlap_line
    from molrl.traces.lint import filter_line, trace_model_feedback

    index = benchmark_index(args.exclude_benchmarks, "--exclude-benchmarks")
    kept, removed, rejects, eval_tasks, seen, written = [], Counter(), [], Counter(), 0, 0
    for path in input_files(args.input):
        reader = read_traces(path, strict=args.strict)
        for _line, trace in reader:
            seen += 1
            reason = _filter_reason(trace, args)
            match = index.match_trace(trace.messages, trace.meta) if index is not None and not reason else None
            if match is not None and match.split == EVAL_SPLIT:
                reason = "eval test tasks"
                eval_tasks[f"{match.benchmark}/{match.split}"] += 1
            if not reason and trace_model_feedback(trace.messages):  # counted among the traces every other test keeps
                written += 1
                reason = "model-written feedback" if args.drop_model_feedback else None
            if reason:
                removed[reason] += 1
            else:
                kept.append(trace)
        rejects += reader.rejects
    write_traces(args.output, kept)
    summary = ", ".join(f"{n} {why}" for why, n in removed.items()) or "none"
    log.info("kept %d traces in %s; filtered out: %s", len(kept), args.output, summary)
    if index is not None:
        log.info("%s", overlap_line(eval_tasks, seen - sum(n for why, n in removed.items() if why != "eval test tasks"),
                                    "--exclude-benchmarks"))
    log.info("%s", filter_line(written, len(kept) + removed["model-written feedback"], args.drop_model_feedback))
    _report_rejects(rejects, args.output, args.rejects)
    return 0


def _filter_reason(trace: Any, args: argparse.Namespace) -> str | None:
    if args.success_only and trace.success is not True:
        return "not successful"
    if trace.count("tool") < args.min_feedback_turns:
        return f"fewer than {args.min_feedback_turns} feedback turns"
    if args.kind and trace.kind != args.kind:
        return f"kind is not {args.kind}"
    return None
