"""Build nested keyword-only dataclasses from YAML mappings and dotted CLI overrides.

Generic on purpose: every section (model, mesh, events, metrics, ...) is a plain dataclass that
validates itself in ``__post_init__``; this module only maps keys to fields, coerces scalar types,
and rejects unknown keys with the list of known ones.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

import yaml

from orchestrator.shared import bounded_yaml
from orchestrator.shared.errors import ConfigError

T = TypeVar("T")


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init}


def _kind(tp: Any) -> str:
    """How an error names one choice of a union setting ("" when it has no short name)."""
    if typing.get_origin(tp) is typing.Literal:
        return " or ".join(str(a) for a in typing.get_args(tp))
    return {bool: "true or false", int: "a whole number", float: "a number",
            str: "a string"}.get(tp, "")


def _coerce(setting: str, tp: Any, value: Any) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last: ConfigError | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(setting, arg, value)
            except ConfigError as exc:
                last = exc
        assert last is not None
        kinds = [_kind(a) for a in args if a is not type(None)]
        if len(kinds) > 1 and all(kinds):  # e.g. auto or a number: name every choice
            choices = " or ".join(kinds)
            raise ConfigError(setting, f"{value!r} is not {choices}",
                              f"set `{setting}` to {choices}")
        raise last
    if dataclasses.is_dataclass(tp):
        if isinstance(tp, type) and isinstance(value, tp):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(setting, f"expected a mapping, got {value!r}",
                              f"write `{setting}` as a section with keys")
        if hasattr(tp, "from_mapping"):  # a section whose keys its own class decides
            return tp.from_mapping(value, prefix=setting)
        return build(tp, value, prefix=setting)
    if origin is typing.Literal:
        if isinstance(value, bool) and value not in args:
            # YAML 1.1 reads on/off/yes/no as booleans; give the word back to a word choice.
            for word in (("on", "yes", "true") if value else ("off", "no", "false")):
                if word in args:
                    value = word
                    break
        if value not in args:
            raise ConfigError(setting, f"{value!r} is not one of {list(args)}",
                              f"set `{setting}` to one of {list(args)}")
        return value
    if origin in (tuple, list):
        if isinstance(value, str):
            value = [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(setting, f"expected a list, got {value!r}",
                              f"write `{setting}` as a list, e.g. [a, b] or a,b")
        inner = args[0] if args else Any
        items = [_coerce(f"{setting}[{i}]", inner, v) for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if origin is dict or tp is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(setting, f"expected a mapping, got {value!r}",
                              f"write `{setting}` as key: value pairs")
        return dict(value)
    if tp is Any:
        return value
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise ConfigError(setting, f"{value!r} is not a boolean",
                          f"set `{setting}` to true or false")
    if tp is int:
        if isinstance(value, bool):
            raise ConfigError(setting, f"{value!r} is not an integer",
                              f"set `{setting}` to a whole number")
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        raise ConfigError(setting, f"{value!r} is not an integer",
                          f"set `{setting}` to a whole number")
    if tp is float:
        if isinstance(value, bool):
            raise ConfigError(setting, f"{value!r} is not a number",
                              f"set `{setting}` to a number")
        if isinstance(value, (int, float)):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise ConfigError(setting, f"{value!r} is not a number", f"set `{setting}` to a number")
    if tp is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise ConfigError(setting, f"{value!r} is not a string", f"set `{setting}` to a string")
    return value


def build(cls: type[T], data: Mapping[str, Any] | None, *, prefix: str = "") -> T:
    """Instantiate dataclass ``cls`` from ``data``; unknown keys raise ConfigError."""
    data = dict(data or {})
    fields = _field_types(cls)
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"{prefix}." if prefix else ""
        raise ConfigError(
            f"{where}{unknown[0]}",
            "unknown setting",
            f"remove it or use one of: {', '.join(where + k for k in sorted(fields))}",
        )
    kwargs = {}
    for name, tp in fields.items():
        if name in data:
            setting = f"{prefix}.{name}" if prefix else name
            kwargs[name] = _coerce(setting, tp, data[name])
    try:
        return cls(**kwargs)
    except TypeError as exc:  # a required field is missing
        raise ConfigError(prefix or cls.__name__, str(exc), "add the missing setting") from None


def to_dict(obj: Any) -> Any:
    """Plain-data view of a config (for YAML dumps, hashing and run metadata)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    return obj


MAX_KEY_PARTS = 32
"""A dotted override key names a setting a few sections deep; a longer one is refused."""


def parse_override(text: str) -> tuple[list[str], Any]:
    """``a.b.c=value`` -> (["a","b","c"], yaml-parsed value), within ``bounded_yaml``'s bounds
    (ConfigError naming the key otherwise)."""
    if "=" not in text:
        raise ConfigError(text[:200], "an override must look like key.sub=value",
                          "write overrides as dotted.key=value, e.g. model.num_layers=4")
    key, raw = text.split("=", 1)
    path = [p for p in key.strip().split(".") if p]
    if not path:
        raise ConfigError(text[:200], "empty key", "write overrides as dotted.key=value")
    if len(path) > MAX_KEY_PARTS:
        raise ConfigError(key[:200], f"has {len(path)} dotted parts (at most {MAX_KEY_PARTS})",
                          "override a setting by its name, e.g. model.num_layers=4")
    try:
        value = bounded_yaml.load(raw, where=".".join(path)[:200]) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return path, value


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Merge dotted overrides into a nested mapping (a copy)."""
    out: dict[str, Any] = _deepcopy(data)
    for text in overrides:
        path, value = parse_override(text)
        node = out
        for i, part in enumerate(path[:-1]):
            nxt = node.get(part)
            if nxt is None:
                nxt = node[part] = {}
            if not isinstance(nxt, dict):
                raise ConfigError(".".join(path[: i + 1]), "is a value, not a section",
                                  f"override `{'.'.join(path[: i + 1])}=...` directly")
            node = nxt
        node[path[-1]] = value
    return out


def _deepcopy(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _deepcopy(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_deepcopy(v) for v in data]
    return data


def load_yaml(path: str) -> dict[str, Any]:
    """The mapping in config file ``path``, read within ``bounded_yaml``'s bounds."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(bounded_yaml.MAX_BYTES + 1)
        data = bounded_yaml.load(text, where="--config")
    except FileNotFoundError:
        raise ConfigError("--config", f"file {path} does not exist",
                          "pass the path of an existing YAML file") from None
    except UnicodeDecodeError as exc:
        raise ConfigError("--config", f"{path} is not UTF-8 text ({exc.reason})",
                          "save the config as UTF-8") from None
    except yaml.YAMLError as exc:
        raise ConfigError("--config", f"{path} is not valid YAML ({exc})",
                          "fix the YAML syntax") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError("--config", f"{path} must hold a mapping at the top level",
                          "write the config as sections: model:, mesh:, train:, ...")
    return data
