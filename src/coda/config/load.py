"""Reading configuration: a YAML, TOML or JSON file, or inline JSON, laid in layers (a file, then
environment variables, then flags), validated into a schema with a one-line error.

Layers merge mapping by mapping, except ``policies``, which merges kind by kind with the rules of
``coda.policy.spec.PoliciesOverride.then`` (a new policy name drops the parameters given for the
old one), so every shell layers a policies block the same way.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from coda.errors import CodaError, invalid
from coda.policy.spec import PoliciesOverride

M = TypeVar("M", bound=BaseModel)
FORMATS = {".toml": "TOML", ".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}


def read_config(source: str | Path, what: str = "config") -> dict[str, Any]:
    """A mapping from a file (YAML unless it ends in ``.toml`` or ``.json``) or from inline JSON
    (text that starts with ``{``); every problem is a one-line ``CodaError`` naming ``what``."""
    text = str(source).strip()
    if text.startswith("{"):
        return _mapping(_parse(text, "JSON", f"{what}: inline JSON"), f"{what}: inline JSON")
    path = Path(source)
    label = f"{what} {path}"
    if not path.exists():
        raise CodaError(f"{label}: no such file; give a YAML, TOML or JSON file{' or inline JSON' if what != 'config' else ''}")
    if path.is_dir():
        raise CodaError(f"{label}: is a directory; give a YAML, TOML or JSON file")
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CodaError(f"{label}: not UTF-8 text; give a YAML, TOML or JSON file") from None
    except OSError as err:
        raise CodaError(f"{label}: cannot be read ({err.strerror})") from None
    return _mapping(_parse(raw, FORMATS.get(path.suffix.lower(), "YAML"), label), label)


def _parse(text: str, fmt: str, label: str) -> Any:
    try:
        if fmt == "TOML":
            return tomllib.loads(text)
        if fmt == "JSON":
            return json.loads(text)
        return yaml.safe_load(text)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as err:
        raise CodaError(f"{label}: not valid {fmt}: {str(err).splitlines()[0]}") from None


def _mapping(data: Any, label: str) -> dict[str, Any]:
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise CodaError(f"{label}: the top level must be a mapping of option names to values")
    return data


def env_layer(environ: Mapping[str, str], prefix: str) -> dict[str, Any]:
    """``PREFIX_PORT=9000``, ``PREFIX_POLICIES__INGRESS__NAME=session``: nested keys joined by ``__``,
    values parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for key, raw in environ.items():
        if not key.startswith(prefix):
            continue
        path = key[len(prefix):].lower().split("__")
        node = out
        for part in path[:-1]:
            node = node.setdefault(part, {})
        try:
            node[path[-1]] = yaml.safe_load(raw) if raw else raw
        except yaml.YAMLError:
            node[path[-1]] = raw
    return out


def layered(*layers: Mapping[str, Any], source: str = "command line") -> dict[str, Any]:
    """The layers merged in order, each over the ones before (see the module docstring); a
    malformed ``policies`` block is a one-line ``CodaError`` naming ``source``."""
    out: dict[str, Any] = {}
    policies: PoliciesOverride | None = None
    for layer in layers:
        for key, value in layer.items():
            if key == "policies":
                if value is not None:
                    given = value if isinstance(value, PoliciesOverride) else validated(PoliciesOverride, value, source, at="policies")
                    policies = given if policies is None else policies.then(given)
            else:
                out[key] = _deep(out.get(key), value)
    if policies is not None:
        out["policies"] = policies
    return out


def _deep(base: Any, over: Any) -> Any:
    if isinstance(over, Mapping) and isinstance(base, Mapping):
        return {**base, **{k: _deep(base.get(k), v) for k, v in over.items()}}
    return over


def validated(model: type[M], data: Mapping[str, Any], source: str, fix: str = "", show_input: bool = False, at: str = "") -> M:
    """``data`` as ``model``, or a one-line ``CodaError`` naming ``source``, the field (under ``at``)
    and the fix (``show_input``: with the offending value, for schemas that hold no secrets)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise invalid(source, err, fix, show_input, at) from None
    except CodaError as err:  # a check across fields (the policies block against the registry)
        raise CodaError(f"{source}: {err}") from None
