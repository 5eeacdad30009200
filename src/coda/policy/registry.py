"""One registry for every kind of policy: ``register(kind, name, factory)``, open to other packages
through the ``coda.policies`` entry-point group.

A factory is a class or a function called with the policy's parameters as keyword arguments; its
signature is the parameter schema (names, defaults, types), so every default lives once, in the
policy. A parameter named ``cost`` is not the user's: Coda passes the shell's cost model. A
parameter whose default is a dataclass instance takes a mapping of that dataclass's parameters.
What a factory builds must fulfil its kind's contract (``coda.policy.contracts``): ``register``
refuses a class that lacks a member, and building refuses an object that does.

An out-of-tree policy registers itself in its package's metadata::

    [project.entry-points."coda.policies"]
    "state.oldest_first" = "my_policies:OldestFirst"

and is then selected like a built-in one (``policies: {state: {name: oldest_first}}``).
"""

from __future__ import annotations

import functools
import inspect
import operator
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

from coda.errors import CodaError
from coda.policy import eviction, execution, ingress, routing, state
from coda.policy.contracts import KIND_NAMES, KINDS, conform
from coda.policy.params import hints, parameters

ENTRY_POINT_GROUP = "coda.policies"
#: Coda's own policies, by kind and name
BUILTIN: dict[str, dict[str, Callable[..., Any]]] = {
    "ingress": {"admit_all": ingress.AdmitAll, "queue_limit": ingress.QueueLimit, "kv_headroom": ingress.KVHeadroom,
                "tenant_share": ingress.TenantShare, "overload": ingress.Overload, "session": ingress.SessionAdmission,
                "deadline": ingress.Deadline, "predicted_wait": ingress.PredictedWait},
    "router": {"round_robin": routing.RoundRobin, "least_loaded": routing.LeastLoaded, "smetric": routing.SMetric,
               "dynamo_kv": routing.DynamoKV, "context_compatible": routing.ContextCompatible},
    "state": {"fifo": state.Fifo, "fewest_blocks": state.FewestBlocks, "tiered_aging": state.TieredAging},
    "execution": {"full": execution.FullBatch, "cohort": execution.Cohort, "split_always": execution.SplitAlways},
    "eviction": {"lru": eviction.Lru, "tool_aware": eviction.ToolAware},
}
#: other names of a policy, kept so that configurations written with them still run
ALIASES: dict[str, dict[str, str]] = {"router": {"coda": "context_compatible"}}


@dataclass(frozen=True, slots=True)
class Entry:
    kind: str
    name: str
    factory: Callable[..., Any]

    @property
    def label(self) -> str:
        return f"{KIND_NAMES[self.kind]} {self.name}"

    @property
    def needs_cost(self) -> bool:
        return "cost" in inspect.signature(self.factory).parameters


_REGISTRY: dict[str, dict[str, Entry]] = {kind: {} for kind in KINDS}
_loaded_entry_points = False


def register(kind: str, name: str, factory: Callable[..., Any]) -> None:
    """Make ``factory`` the policy ``name`` of ``kind`` (one of ``ingress``, ``router``, ``state``,
    ``execution``, ``eviction``). Registering a name again replaces it (built-in ones included).
    A class must fulfil its kind's contract (a function is checked on what it builds)."""
    _load_entry_points()
    _add(kind, name, factory, replace=True)


def _add(kind: str, name: str, factory: Callable[..., Any], replace: bool) -> None:
    if kind not in _REGISTRY:
        raise CodaError(f"unknown policy kind {kind!r}; valid: {', '.join(KINDS)}")
    if not name or "+" in name:
        raise CodaError(f"{KIND_NAMES[kind]} name {name!r}: use a non-empty name without '+' ('+' composes ingress policies)")
    if isinstance(factory, type):
        conform(kind, name, factory)
    if replace or name not in _REGISTRY[kind]:
        _REGISTRY[kind][name] = Entry(kind, name, factory)


def _load_entry_points() -> None:
    """Coda's own policies (``coda.policy.builtin``), then those other packages declare in the
    ``coda.policies`` group, named ``kind.name``."""
    global _loaded_entry_points
    if _loaded_entry_points:
        return
    _loaded_entry_points = True
    for kind, table in BUILTIN.items():
        for name, factory in table.items():
            _add(kind, name, factory, replace=True)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        kind, _, name = ep.name.partition(".")
        if kind not in _REGISTRY or not name:
            raise CodaError(
                f"entry point {ep.name} = {ep.value} in group {ENTRY_POINT_GROUP}: name it kind.name, kind one of {', '.join(KINDS)}"
            )
        try:
            factory = ep.load()
        except Exception as err:  # a broken plugin must name itself, not crash Coda with its traceback
            raise CodaError(f"entry point {ep.name} = {ep.value}: cannot load it ({type(err).__name__}: {err})") from None
        _add(kind, name, factory, replace=False)


def names(kind: str) -> list[str]:
    """Every registered name of a kind, entry points included."""
    _load_entry_points()
    return sorted(_REGISTRY[kind])


def lookup(kind: str, name: str) -> Entry:
    """The entry registered under ``name`` (or the name it is an alias of)."""
    _load_entry_points()
    entry = _REGISTRY[kind].get(name) or _REGISTRY[kind].get(ALIASES.get(kind, {}).get(name, ""))
    if entry is None:
        raise CodaError(f"unknown {KIND_NAMES[kind]} {name!r}; valid: {', '.join(names(kind))}")
    return entry


# --- the catalogue -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    type: str
    default: Any


@dataclass(frozen=True, slots=True)
class Described:
    """One registered policy as ``coda policies`` lists it."""

    kind: str
    name: str
    factory: str
    aliases: tuple[str, ...]
    summary: str
    parameters: tuple[Parameter, ...]


def catalogue(kind: str | None = None) -> list[Described]:
    """Every registered policy (of ``kind``, or of all kinds), with its parameters, their types and
    defaults, and the first sentence of its docstring."""
    _load_entry_points()
    kinds = KINDS if kind is None else (kind,)
    if kind is not None and kind not in _REGISTRY:
        raise CodaError(f"unknown policy kind {kind!r}; valid: {', '.join(KINDS)}")
    out = []
    for k in kinds:
        aliases = ALIASES.get(k, {})
        for name in names(k):
            factory = _REGISTRY[k][name].factory
            found = hints(factory)
            params = tuple(
                Parameter(p.name, _type_name(found.get(p.name, p.annotation)), None if p.default is inspect.Parameter.empty else p.default)
                for p in parameters(factory).values()
            )
            doc = " ".join((inspect.getdoc(factory) or "").split("\n\n")[0].split())
            out.append(
                Described(
                    k,
                    name,
                    f"{factory.__module__}.{factory.__qualname__}",
                    tuple(a for a, target in aliases.items() if target == name),
                    doc,
                    params,
                )
            )
    return out


def _type_name(hint: Any) -> str:
    """A hint as ``coda policies`` prints it: its type, without the constraint metadata."""
    hint = _plain(hint)
    if hint is inspect.Parameter.empty:
        return "any"
    if isinstance(hint, type):
        return hint.__name__
    return str(hint).replace("typing.", "")


def _plain(hint: Any) -> Any:
    """``hint`` with ``Annotated`` metadata stripped, through unions."""
    if typing.get_origin(hint) is typing.Annotated:
        return _plain(typing.get_args(hint)[0])
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = tuple(_plain(a) for a in typing.get_args(hint))
        return functools.reduce(operator.or_, args)
    return hint
