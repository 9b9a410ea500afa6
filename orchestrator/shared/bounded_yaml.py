"""The one YAML reader for configs and overrides: ``yaml.safe_load`` with bounds.

A config is a few kilobytes of plain sections, so anything far beyond that is refused as a
``ConfigError`` before it costs memory or a crash: a text over ``MAX_BYTES``; nesting deeper than
``MAX_DEPTH`` (PyYAML composes recursively: RecursionError otherwise); more than ``MAX_NODES``
nodes once every alias is counted as the nodes it stands for (an alias bomb is a few lines that
expand to gigabytes when copied); an alias to a node that contains it (a cycle); an integer of
more than ``MAX_INT_DIGITS`` digits (Python's ``int()`` refuses past 4,300: ValueError). The
checks run while the document is composed, before anything is constructed or copied.
"""

from __future__ import annotations

from typing import Any

import yaml

from orchestrator.shared.errors import ConfigError

MAX_BYTES = 1 << 20
MAX_DEPTH = 64
MAX_NODES = 100_000
MAX_INT_DIGITS = 100
_INT_TAG = "tag:yaml.org,2002:int"


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader whose composer counts depth and expanded nodes (module docstring)."""

    def __init__(self, stream: str, where: str) -> None:
        super().__init__(stream)
        self._where = where
        self._depth = 0
        self._weight: dict[int, int] = {}  # id(node) -> nodes it expands to, once composed

    def _refuse(self, problem: str) -> ConfigError:
        return ConfigError(self._where, problem, "write the config as plain sections and values "
                           "(no deep nesting, no alias that repeats a large part, no huge "
                           "number)")

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            node = super().compose_node(parent, index)
            if id(node) not in self._weight:
                raise self._refuse("an alias refers to a node that contains it (a cycle)")
            return node
        self._depth += 1
        if self._depth > MAX_DEPTH:
            raise self._refuse(f"nests deeper than {MAX_DEPTH} levels")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        self._weight[id(node)] = weight = 1 + sum(self._weight[id(c)] for c in _children(node))
        if weight > MAX_NODES:
            raise self._refuse(f"expands to more than {MAX_NODES} values (aliases counted as "
                               "what they repeat)")
        if (node.tag == _INT_TAG and isinstance(node.value, str)
                and len(node.value) > MAX_INT_DIGITS):
            raise self._refuse(f"holds an integer of {len(node.value)} digits (at most "
                               f"{MAX_INT_DIGITS})")
        return node


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def load(text: str, *, where: str) -> Any:
    """``text`` parsed as YAML within the bounds; ConfigError naming ``where`` (the setting or
    ``--config``) otherwise. yaml.YAMLError propagates for plain syntax errors."""
    if len(text) > MAX_BYTES:
        raise ConfigError(where, f"is {len(text)} characters, over the {MAX_BYTES} a config may "
                          "have", "keep the config to its settings (data belongs in files the "
                          "task reads)")
    loader = _BoundedLoader(text, where)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()
