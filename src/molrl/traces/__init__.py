"""Traces: the multi-turn episode format, importers, and role-labelled tokenisation."""

from molrl.traces.schema import KINDS, Reject, Trace, TraceError, TraceReader, append_trace, read_traces, write_traces
from molrl.traces.spans import Rendering, encode_chat, locate_spans
from molrl.traces.tokenize import TokenizeConfig, TokenizedTrace, tokenize_file, tokenize_trace

__all__ = [
    "KINDS",
    "Reject",
    "Rendering",
    "Trace",
    "TraceError",
    "TraceReader",
    "TokenizeConfig",
    "TokenizedTrace",
    "append_trace",
    "encode_chat",
    "locate_spans",
    "read_traces",
    "tokenize_file",
    "tokenize_trace",
    "write_traces",
]
