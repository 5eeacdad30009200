"""Reading configuration: a YAML, TOML or JSON file, or inline JSON, laid in layers (a file, then
environment variables, then flags), validated into a schema with a one-line error.

Layers merge mapping by mapping, except ``policies``: its layers are kept in order (``Layers``) for
the schema to merge kind by kind with the rules of ``coda.policy.spec.PoliciesOverride.then`` (a new
policy name drops the parameters given for the old one), so every shell layers a policies block the
same way and the block is read in one place.
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError

from coda.errors import CodaError, invalid
from coda.policy.spec import Layers

M = TypeVar("M", bound=BaseModel)
FORMATS = {".toml": "TOML", ".json": "JSON", ".yaml": "YAML", ".yml": "YAML"}
#: the largest config file or inline JSON read: assumed (the largest shipped config is a few KiB)
MAX_CONFIG_BYTES = 4 * 2**20
#: the most values a YAML config may hold once its aliases are expanded: assumed, far above any real
#: config and far below what an alias bomb (a few lines that expand to billions of values) makes
MAX_CONFIG_NODES = 100_000


def read_config(source: str | Path, what: str = "config") -> dict[str, Any]:
    """A mapping from a file (YAML unless it ends in ``.toml`` or ``.json``) or from inline JSON
    (text that starts with ``{``); every problem is a one-line ``CodaError`` naming ``what``."""
    text = str(source).strip()
    if text.startswith("{"):
        _bounded(len(text.encode(errors="surrogatepass")), f"{what}: inline JSON")
        return _mapping(_parse(text, "JSON", f"{what}: inline JSON"), f"{what}: inline JSON")
    path = Path(source)
    label = f"{what} {path}"
    if not path.exists():
        raise CodaError(f"{label}: no such file; give a YAML, TOML or JSON file{' or inline JSON' if what != 'config' else ''}")
    if path.is_dir():
        raise CodaError(f"{label}: is a directory; give a YAML, TOML or JSON file")
    if path.is_file():  # a pipe or a device has no size to check before reading
        _bounded(path.stat().st_size, label)
    try:
        raw = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise CodaError(f"{label}: not UTF-8 text; give a YAML, TOML or JSON file") from None
    except OSError as err:
        raise CodaError(f"{label}: cannot be read ({err.strerror})") from None
    return _mapping(_parse(raw, FORMATS.get(path.suffix.lower(), "YAML"), label), label)


def _bounded(size: int, label: str) -> None:
    if size > MAX_CONFIG_BYTES:
        raise CodaError(f"{label}: {size} bytes, more than a config may hold ({MAX_CONFIG_BYTES}); give the settings, not data")


def _parse(text: str, fmt: str, label: str) -> Any:
    try:
        if fmt == "TOML":
            return tomllib.loads(text)
        if fmt == "JSON":
            return json.loads(text)
        return _yaml(text, label)
    except (tomllib.TOMLDecodeError, json.JSONDecodeError, yaml.YAMLError) as err:
        raise CodaError(f"{label}: not valid {fmt}: {str(err).splitlines()[0]}") from None
    except RecursionError:
        raise CodaError(f"{label}: nested too deeply to be a {fmt} config; give the settings, not data") from None


def _yaml(text: str, label: str) -> Any:
    """``yaml.safe_load``, refused before construction when its aliases expand past
    ``MAX_CONFIG_NODES`` values or refer to themselves (what would be built is the expansion)."""
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node, label)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expansion(root: yaml.Node, label: str) -> None:
    """How many values ``root`` holds with every alias expanded, counted once per node (an alias is
    the same node object as its anchor), without expanding anything."""
    sizes: dict[int, int] = {}
    open_nodes: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        if id(node) in sizes:
            continue
        kids = [x for pair in node.value for x in pair] if isinstance(node, yaml.MappingNode) else node.value
        kids = kids if isinstance(node, yaml.CollectionNode) else []
        if children_done:
            sizes[id(node)] = 1 + sum(sizes[id(k)] for k in kids)
            if sizes[id(node)] > MAX_CONFIG_NODES:
                raise CodaError(
                    f"{label}: its aliases expand to more than {MAX_CONFIG_NODES} values; a config holds settings, so write "
                    "them out or use fewer aliases"
                )
        elif id(node) in open_nodes:
            raise CodaError(f"{label}: an alias refers to a value that contains it; a config cannot nest itself")
        else:
            open_nodes.add(id(node))
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in sizes)


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


def layered(*layers: Mapping[str, Any]) -> dict[str, Any]:
    """The layers merged in order, each over the ones before; ``policies`` as the ``Layers`` of the
    layers' blocks (see the module docstring)."""
    out: dict[str, Any] = {}
    policies: list[Any] = []
    for layer in layers:
        for key, value in layer.items():
            if key == "policies":
                policies.extend(value if isinstance(value, Layers) else [value] if value is not None else [])
            else:
                out[key] = _deep(out.get(key), value)
    if policies:
        out["policies"] = Layers(policies)
    return out


def _deep(base: Any, over: Any) -> Any:
    if isinstance(over, Mapping) and isinstance(base, Mapping):
        return {**base, **{k: _deep(base.get(k), v) for k, v in over.items()}}
    return over


def config_options(data: dict[str, Any], kinds: Mapping[str, Any], source: str) -> dict[str, Any]:
    """Take out of ``data`` the options a command reads beside its schema (``workload``, ``out``,
    ...), each checked against its type in ``kinds``: a wrong type is a one-line ``CodaError``
    naming ``source`` and the key, never a traceback later."""
    out: dict[str, Any] = {}
    for key, kind in kinds.items():
        if key in data:
            try:
                out[key] = TypeAdapter(kind).validate_python(data.pop(key))
            except ValidationError as err:
                raise invalid(source, err, show_input=True, at=key) from None
    return out


def validated(model: type[M], data: Mapping[str, Any], source: str, fix: str = "", show_input: bool = False, at: str = "") -> M:
    """``data`` as ``model``, or a one-line ``CodaError`` naming ``source``, the field (under ``at``)
    and the fix (``show_input``: with the offending value, for schemas that hold no secrets)."""
    try:
        return model.model_validate(data)
    except ValidationError as err:
        raise invalid(source, err, fix, show_input, at) from None
    except CodaError as err:  # a check across fields (the policies block against the registry)
        raise CodaError(f"{source}: {err}") from None
