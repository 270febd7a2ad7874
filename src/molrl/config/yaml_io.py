"""Config text as plain data: YAML read under the 1.2 core schema, every mapping's keys unique, depth and size bounded.

PyYAML resolves plain scalars by YAML 1.1, where ``1:30`` is the base-60 number 90, ``yes``/``no``/``on``/``off`` are
booleans, ``010`` is octal 8 and ``2024-01-01`` a date. Config files and command-line values are read by YAML 1.2's
core schema instead: ``true``/``false`` are the only booleans, numbers are decimal (or ``0o``/``0x``), and everything
else is a string, which a typed key then takes or refuses by name. A mapping that names one key twice is refused (plain
YAML keeps the last), and so is nesting past ``MAX_YAML_DEPTH`` levels or a document of more than ``MAX_YAML_NODES``
values, aliases counted at their expanded size.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from molrl.errors import ConfigError

MAX_YAML_DEPTH = 64
"""Deepest nesting of a config document (a config is a few levels deep; past some thousands Python's recursion
ends)."""
MAX_YAML_NODES = 100_000
"""Most values in a config document, each alias counted as the values it repeats (a config holds a few hundred)."""
MAX_YAML_TEXT = 1 << 20
"""Longest config text parsed, in characters (a file's cap, and a command-line value's)."""


class ConfigLoader(yaml.SafeLoader):
    """PyYAML's safe loader under the YAML 1.2 core schema, refusing a repeated key, deep nesting and a huge
    document."""

    yaml_implicit_resolvers: dict[Any, list[Any]] = {}  # none of SafeLoader's 1.1 resolvers: the core ones below

    def __init__(self, text: str, name: str) -> None:
        super().__init__(text)
        self.name = name
        self._depth = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values under it, aliases expanded

    def compose_node(self, parent: Any, index: Any) -> Any:
        """A node, refused past ``MAX_YAML_DEPTH`` levels or when its values, aliases expanded, pass
        ``MAX_YAML_NODES``."""
        mark = self.peek_event().start_mark
        alias = self.check_event(yaml.AliasEvent)
        self._depth += 1
        if self._depth > MAX_YAML_DEPTH:
            raise ConfigError(f"{self.name}:{mark.line + 1}: nested deeper than {MAX_YAML_DEPTH} levels; a config is a "
                              "few levels deep")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if not alias:
            children = node.value if isinstance(node, yaml.SequenceNode) else \
                [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else []
            self._sizes[id(node)] = 1 + sum(self._sizes.get(id(child), 1) for child in children)
        if self._sizes.get(id(node), 1) > MAX_YAML_NODES:
            raise ConfigError(f"{self.name}:{mark.line + 1}: more than {MAX_YAML_NODES} values (aliases counted as "
                              "what they repeat); a config is a small YAML document")
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        """The mapping of ``node``, refused when it names one key twice."""
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: merged (and overridden) by PyYAML
                continue
            key = self.construct_object(key_node, deep=True)
            line = key_node.start_mark.line + 1
            if isinstance(key, (str, int, float, bool)) and key in seen:
                raise ConfigError(f"{key_node.start_mark.name}:{line}: key {key!r} appears twice in one mapping "
                                  f"(first on line {seen[key]}); keep one")
            if isinstance(key, (str, int, float, bool)):
                seen[key] = line
        return super().construct_mapping(node, deep)


def _core_int(loader: ConfigLoader, node: yaml.ScalarNode) -> int:
    """A core-schema integer: decimal (``010`` is ten), ``0o`` octal or ``0x`` hexadecimal."""
    text = str(loader.construct_scalar(node))
    if text[:2] in ("0o", "0x"):
        return int(text[2:], 8 if text[1] == "o" else 16)
    return int(text)


CORE_RESOLVERS = [  # (tag, pattern, first characters), in the order YAML 1.2's core schema tries them
    ("tag:yaml.org,2002:null", r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    ("tag:yaml.org,2002:bool", r"^(?:true|True|TRUE|false|False|FALSE)$", list("tTfF")),
    ("tag:yaml.org,2002:int", r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", list("-+0123456789")),
    ("tag:yaml.org,2002:float", r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
                                r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$", list("-+0123456789.")),
    ("tag:yaml.org,2002:merge", r"^(?:<<)$", ["<"]),  # not core, but PyYAML's merge keys keep working
]
"""The implicit tags of plain scalars under YAML 1.2's core schema (https://yaml.org/spec/1.2.2/#1032-tag-resolution)."""

for _tag, _pattern, _first in CORE_RESOLVERS:
    ConfigLoader.add_implicit_resolver(_tag, re.compile(_pattern), _first)
ConfigLoader.add_constructor("tag:yaml.org,2002:int", _core_int)


class NotYaml(ConfigError):
    """Text that YAML cannot parse (an override's value is then taken as the plain string)."""


def parse_yaml(text: str, name: str) -> Any:
    """YAML ``text`` (from ``name``, for messages) as plain data under the 1.2 core schema: duplicate keys, bad
    syntax, deep or huge documents and integers too long to convert are one-line ``ConfigError``s."""
    if len(text) > MAX_YAML_TEXT:
        raise ConfigError(f"{name}: over {MAX_YAML_TEXT >> 20} MiB of text; a config is a small YAML document")
    loader = None
    try:
        loader = ConfigLoader(text, name)  # its reader refuses control characters at once
        return loader.get_single_data()
    except ConfigError:
        raise
    except yaml.YAMLError as err:
        raise NotYaml(f"{name}: not valid YAML: {' '.join(str(err).split())}") from None
    except ValueError as err:  # an integer of more digits than Python converts
        raise ConfigError(f"{name}: {err.args[0].split(';')[0]}; write a smaller number") from None
    finally:
        if loader is not None:
            loader.dispose()
