"""A policy's parameters as a typed model, built from its signature and checked once, when a
configuration loads, in every shell.

A policy declares each parameter's type and constraints where it declares the parameter, on its
own signature, with ``annotated_types`` metadata (``tau_s: Positive = 5.0``). ``model_of`` turns
that signature into a strict pydantic model; ``checked`` validates a user's ``params`` against it
and answers with the keyword arguments to build the policy from, or a one-line ``CodaError`` that
names the policy, the parameter, what it must be and what it got. The configuration schemas of
``coda sim``, ``coda serve`` and ``CODA_SCHEDULER_CONFIG`` call it when they load (through
``coda.policy.spec.PoliciesConfig``), so a bad value fails there with the same line in each.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Annotated, Any, Literal

from annotated_types import Ge, Gt, Interval, Le, Lt
from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from coda.errors import CodaError

#: a time, weight or rate that must be above zero
Positive = Annotated[float, Gt(0)]
#: a time, share or slack that may be zero
NonNegative = Annotated[float, Ge(0)]
#: a share of a whole, within [0, 1]
Fraction = Annotated[float, Interval(ge=0, le=1)]
#: a count that may be zero (0 often means "no cap")
Count = Annotated[int, Ge(0)]
#: a count that must be at least one
AtLeastOne = Annotated[int, Ge(1)]

#: fields of a policy class that are not parameters: its name, what it reads, and what Coda supplies
RESERVED = frozenset({"name", "signals", "worker_fields", "session_status", "cost"})
_STRICT = ConfigDict(strict=True, extra="forbid", arbitrary_types_allowed=True)
_WANT = {"int_type": "an integer", "float_type": "a number", "bool_type": "true or false", "string_type": "a string"}


def parameters(factory: Callable[..., Any]) -> dict[str, inspect.Parameter]:
    """The user-settable parameters of a factory (its keyword parameters, less the reserved ones)."""
    kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    return {n: p for n, p in inspect.signature(factory).parameters.items() if p.kind in kinds and n not in RESERVED}


def hints(factory: Callable[..., Any]) -> dict[str, Any]:
    """The factory's type hints with their constraint metadata (``{}`` where they cannot be resolved)."""
    target = factory.__init__ if isinstance(factory, type) and not dataclasses.is_dataclass(factory) else factory
    try:
        return typing.get_type_hints(target, include_extras=True)
    except (NameError, TypeError):
        return {}


def _nested(default: Any) -> bool:
    """A parameter whose default is a dataclass instance takes a mapping of that dataclass's parameters."""
    return dataclasses.is_dataclass(default) and not isinstance(default, type)


@functools.cache
def model_of(factory: Callable[..., Any]) -> type[BaseModel]:
    """The strict model of a factory's parameters: each typed by its hint (``Any`` without one),
    with its constraints; a dataclass-valued parameter is the model of that dataclass."""
    found = hints(factory)
    fields: dict[str, Any] = {}
    for name, p in parameters(factory).items():
        default = ... if p.default is inspect.Parameter.empty else p.default
        if _nested(default):
            fields[name] = (model_of(type(default)) | None, None)
        else:
            fields[name] = (found.get(name, Any), default)
    return create_model(f"{getattr(factory, '__qualname__', 'policy')}Params", __config__=_STRICT, **fields)


def checked(factory: Callable[..., Any], params: Mapping[str, Any], label: str) -> dict[str, Any]:
    """Keyword arguments for ``factory`` from a user's ``params``: only those given, typed and
    within their constraints; anything else is a one-line ``CodaError`` starting with ``label``."""
    model = model_of(factory)
    unknown = sorted(set(params) - set(model.model_fields))
    if unknown:
        raise CodaError(f"{label}: unknown parameter(s) {', '.join(unknown)}; valid: {', '.join(model.model_fields) or '(none)'}")
    accepted = parameters(factory)
    nested = {k for k in params if _nested(accepted[k].default)}
    plain = {k: v for k, v in params.items() if k not in nested}
    try:
        model_ = model.model_validate(plain)  # all at once: a parameter without a default must be given
    except ValidationError as err:
        first = err.errors()[0]
        key = str(first["loc"][0])
        if first["type"] == "missing":
            raise CodaError(f"{label}: parameter {key} has no default; give it in params") from None
        raise CodaError(f"{label}: {_message(key, plain[key], err, hints(factory).get(key))}") from None
    out: dict[str, Any] = {k: getattr(model_, k) for k in plain}
    for key in nested:
        default, value = accepted[key].default, params[key]
        if not isinstance(value, Mapping):
            raise CodaError(f"{label}: parameter {key} takes a mapping of {type(default).__name__}'s parameters, got {value!r}")
        out[key] = dataclasses.replace(default, **checked(type(default), value, f"{label} {key}"))
    return out


def _message(key: str, value: Any, err: ValidationError, hint: Any) -> str:
    """One line for the first error: the type it must have, the values it may take, or its bounds."""
    kind = err.errors()[0]["type"]
    if kind in _WANT:
        return f"parameter {key}={value!r} must be {_WANT[kind]}"
    if kind == "literal_error":
        return f"parameter {key}={value!r} must be one of {', '.join(map(repr, _choices(hint)))}"
    low, high = _bounds(hint)
    if low and high:
        return f"{key} must be within [{low[1]:g}, {high[1]:g}], got {value}"
    if low:
        return f"{key} must be {low[0]} {low[1]:g}, got {value}"
    if high:
        return f"{key} must be {high[0]} {high[1]:g}, got {value}"
    return f"parameter {key}={value!r}: {err.errors()[0]['msg']}"


def _choices(hint: Any) -> tuple[Any, ...]:
    for arg in _layers(hint):
        if typing.get_origin(arg) is Literal:
            return typing.get_args(arg)
    return ()


def _bounds(hint: Any) -> tuple[tuple[str, float] | None, tuple[str, float] | None]:
    """The lower and upper bounds a hint's metadata sets, each as (operator, value)."""
    low = high = None
    for arg in _layers(hint):
        for meta in getattr(arg, "__metadata__", ()):
            for part in _split(meta):
                if isinstance(part, Ge):
                    low = (">=", part.ge)
                elif isinstance(part, Gt):
                    low = (">", part.gt)
                elif isinstance(part, Le):
                    high = ("<=", part.le)
                elif isinstance(part, Lt):
                    high = ("<", part.lt)
    return low, high


def _split(meta: Any) -> list[Any]:
    """An ``Interval`` as its bounds; any other metadata as itself."""
    if not isinstance(meta, Interval):
        return [meta]
    return [Ge(meta.ge)] * (meta.ge is not None) + [Le(meta.le)] * (meta.le is not None)


def _layers(hint: Any) -> list[Any]:
    """A hint and, through unions, the hints it is made of (``Annotated[int, Ge(1)] | None``)."""
    out = [hint]
    for arg in typing.get_args(hint):
        if typing.get_origin(arg) is not None or hasattr(arg, "__metadata__"):
            out.extend(_layers(arg))
    return out
