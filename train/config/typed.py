"""The typed builder under the configuration: dataclasses built from YAML data, every key checked and every
value converted to its field's type (`build`), YAML scalars read with their text kept (`load_scalars`), and a
config back to plain data (`settings_dict`).

    section = build(RLSection, {"steps": 4, "stare": {"w": 1.2}}, "rl.")
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import difflib
import math
import types
import typing
from typing import Any, Literal

import yaml

from stare_agents.train.config_fields import DERIVED_FROM, INLINE


class _Scalar(str):
    """A plain YAML scalar whose YAML reading is not a string (a bool, number, null or date): its text, and
    that reading (`value`). A field typed str takes the text (`sft.data: off` is "off"); others the reading."""

    value: Any


class _Loader(yaml.SafeLoader):
    pass


def _keep_text(construct: Any) -> Any:
    def scalar(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> _Scalar:
        text = _Scalar(node.value)
        text.value = construct(loader, node)
        return text

    return scalar


for _tag in ("bool", "int", "float", "null", "timestamp"):
    _name = f"tag:yaml.org,2002:{_tag}"
    _Loader.add_constructor(_name, _keep_text(yaml.SafeLoader.yaml_constructors[_name]))


def load_scalars(text: str, where: str) -> Any:
    try:
        return yaml.load(text, Loader=_Loader)  # a SafeLoader that keeps the scalars' text
    except yaml.YAMLError as error:
        raise ValueError(f"{where}: not valid YAML ({error})") from None


def plain_data(value: Any) -> Any:
    """`value` with every scalar as YAML read it (dates as ISO text), mappings and tuples as dicts and lists."""
    if isinstance(value, _Scalar):
        value = value.value
    if isinstance(value, dict):
        return {plain_data(k): plain_data(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain_data(v) for v in value]
    if isinstance(value, datetime.date):
        return value.isoformat()
    return value


def flatten(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def settings_dict(value: Any) -> Any:
    """`value` with its dataclasses as dicts (as dataclasses.asdict), less the fields derived from another."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out: dict[str, Any] = {}
        for f in dataclasses.fields(value):
            if DERIVED_FROM in f.metadata:
                continue
            if f.metadata.get(INLINE):  # its fields in this mapping, less the name its holder gives it
                out.update((k, v) for k, v in settings_dict(getattr(value, f.name)).items() if k != "name")
            else:
                out[f.name] = settings_dict(getattr(value, f.name))
        return out
    if isinstance(value, list | tuple):
        return type(value)(settings_dict(v) for v in value)
    if isinstance(value, dict):
        return {k: settings_dict(v) for k, v in value.items()}
    return copy.deepcopy(value)


def derived_keys(cls: type, prefix: str = "") -> list[str]:
    """The dotted keys under dataclass `cls` that the run derives from another setting (not settings)."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if DERIVED_FROM in f.metadata:
            keys.append(prefix + f.name)
            continue
        hint = hints[f.name]
        if typing.get_origin(hint) in (typing.Union, types.UnionType):
            hint = next((a for a in typing.get_args(hint) if a is not type(None)), hint)
        if dataclasses.is_dataclass(hint):
            keys += derived_keys(hint, prefix if f.metadata.get(INLINE) else f"{prefix}{f.name}.")
    return keys


def build(cls: type, data: Any, where: str, base: Any = None) -> Any:
    """Build dataclass `cls` from a mapping, checking every key and converting every value to its field's type.

    A key left out takes `base`'s value when a base is given (the algorithm preset's, for the RL section), else
    the field's default. An error names the key (`where` + field), the value and what is allowed."""
    if isinstance(data, _Scalar):
        data = data.value
    if not isinstance(data, dict):
        raise ValueError(f"{where.rstrip('.') or 'config'}={plain_data(data)!r}: allowed: a mapping of keys")
    base_for = getattr(cls, "base_for", None)  # a section whose left-out keys come from another (RLSection)
    if base is None and base_for is not None:
        base = base_for(data, where)
    hints = typing.get_type_hints(cls)
    fields_ = [f for f in dataclasses.fields(cls) if f.init]
    for f in fields_:
        if DERIVED_FROM in f.metadata and f.name in data:
            raise ValueError(
                f"{where}{f.name}={plain_data(data[f.name])!r}: not a setting; the run derives it from "
                f"{f.metadata[DERIVED_FROM]} (set that instead)"
            )
    # an INLINE field's own keys (less the name its holder gives it) sit in this mapping, where it is declared
    inline = {
        f.name: [g.name for g in dataclasses.fields(hints[f.name]) if g.name != "name"]
        for f in fields_
        if f.metadata.get(INLINE)
    }
    known = [key for f in fields_ if DERIVED_FROM not in f.metadata for key in inline.get(f.name, [f.name])]
    unknown = sorted(set(data) - set(known), key=str)
    if unknown:
        section = repr(where.rstrip(".")) if where else "the config"
        raise ValueError(
            f"unknown key(s) {unknown} in {section}; known: {known}{did_you_mean(unknown, known)}"
        )
    field_type = getattr(
        cls, "field_type", None
    )  # a field whose type another key decides (AlgorithmConfig.stare)
    kwargs = {}
    for name, keys in inline.items():
        inner_base = getattr(base, name) if base is not None else None
        kwargs[name] = build(hints[name], {k: data[k] for k in keys if k in data}, where, inner_base)
    for name in (f.name for f in fields_ if DERIVED_FROM not in f.metadata and f.name not in inline):
        if name in data:
            inner_base = getattr(base, name, None) if base is not None else None
            if base is not None and inner_base is None and isinstance(data[name], dict) and data[name]:
                key, value = next(iter(flatten(data[name]).items()))
                presets = getattr(cls, "presets_with", None)
                having = f" ({', '.join(presets(name))})" if presets is not None else ""
                raise ValueError(
                    f"{where}{name}.{key}={plain_data(value)!r}: rl.algorithm={getattr(base, 'name', '?')} "
                    f"has no {name} ({name}: null in its preset); allowed: an algorithm whose preset has it"
                    f"{having}, or {where}{name}=null to leave it out"
                )
            hint = hints[name]
            resolved = field_type(name, data, base) if field_type is not None else None
            if resolved is not None:
                hint = resolved | None if type(None) in typing.get_args(hint) else resolved
            kwargs[name] = convert(hint, data[name], f"{where}{name}", inner_base)
        elif base is not None and hasattr(base, name):
            kwargs[name] = getattr(base, name)
    try:
        built = cls(**kwargs)
    except (ValueError, TypeError) as error:
        if not where or str(error).startswith(where.rstrip(".")):
            raise ValueError(str(error)) from None
        raise ValueError(f"{where.rstrip('.')}: {error}") from None
    # a value the config set that the built settings would never read (StareConfig: M under variant O1)
    check_given = getattr(built, "check_given", None)
    if check_given is not None:
        check_given(set(data), where, base)
    return built


def did_you_mean(unknown: list[Any], known: list[str]) -> str:
    """ "; did you mean 'x'?" for the first unknown word with a near known one (as Gymnasium's registry
    answers), else ""."""
    for word in unknown:
        near = difflib.get_close_matches(str(word), known, n=1)
        if near:
            return f"; did you mean {near[0]!r}?"
    return ""


def convert(hint: Any, value: Any, where: str, base: Any = None) -> Any:
    """`value` as type `hint`, or a ValueError naming `where`, the value and what is allowed."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        options = [a for a in typing.get_args(hint) if a is not type(None)]
        if (value.value if isinstance(value, _Scalar) else value) is None:
            return None
        return convert(options[0], value, where, base) if len(options) == 1 else plain_data(value)
    if isinstance(value, _Scalar):  # a field typed str (or a set of words) takes the text: off, 2024-01-01
        value = str(value) if _wants_text(hint) else value.value
    shown = plain_data(value)
    if origin is Literal:
        allowed = typing.get_args(hint)
        if isinstance(value, bool) or value not in allowed:
            near = did_you_mean([value], [str(a) for a in allowed])
            raise ValueError(f"{where}={shown!r}: allowed: {', '.join(map(str, allowed))}{near}")
        return value
    if dataclasses.is_dataclass(hint):
        return build(hint, value, where + ".", base)
    if hint is Any:
        return plain_data(value)
    if origin is dict:
        if not isinstance(value, dict):
            raise ValueError(f"{where}={shown!r}: allowed: a mapping")
        key_type, value_type = typing.get_args(hint) or (Any, Any)
        return {
            convert(key_type, k, f"{where}.{k}"): convert(value_type, v, f"{where}.{k}")
            for k, v in value.items()
        }
    if origin in (list, tuple):
        if not isinstance(value, list | tuple):
            raise ValueError(f"{where}={shown!r}: allowed: a list")
        args = typing.get_args(hint)
        if origin is tuple and args and args[-1] is not Ellipsis:
            if len(value) != len(args):
                raise ValueError(
                    f"{where}={shown!r}: allowed: a list of {len(args)} "
                    f"({', '.join(getattr(a, '__name__', str(a)) for a in args)})"
                )
            return tuple(
                convert(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
            )
        item = args[0] if args else Any
        if dataclasses.is_dataclass(item):  # entries that are not mappings are their section's to check
            return origin(
                convert(item, v, f"{where}[{i}]") if isinstance(v, dict) else _text_or_plain(v)
                for i, v in enumerate(value)
            )
        return origin(convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if hint is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-6" (no dot) as a string
            try:
                value = float(value)
            except ValueError:
                raise ValueError(f"{where}={shown!r}: allowed: a finite number") from None
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{where}={shown!r}: allowed: a finite number")
        return float(value)
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"{where}={shown!r}: allowed: an int")
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ValueError(f"{where}={shown!r}: allowed: true or false")
        return value
    if hint is str:
        if not isinstance(value, str):
            raise ValueError(f"{where}={shown!r}: allowed: a string")
        return value
    return value


def _text_or_plain(value: Any) -> Any:
    return str(value) if isinstance(value, _Scalar) else plain_data(value)


def _wants_text(hint: Any) -> bool:
    args = typing.get_args(hint)
    return hint is str or (typing.get_origin(hint) is Literal and all(isinstance(a, str) for a in args))
