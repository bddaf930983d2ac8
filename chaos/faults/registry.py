"""The fault registry: YAML ``kind`` -> (params model, Fault class).

Every module in the ``chaos.faults`` package (other than ``base`` and ``registry``) is imported
by :func:`load_builtin_faults`, and registers its kind with ``@register("<kind>")``. The
scenario model's ``faults`` union is :func:`fault_union` over what is registered, so a new fault
module adds a YAML kind and a JSON-schema entry by itself existing.
"""

from __future__ import annotations

import importlib
import pkgutil
import typing
from typing import Annotated, Any, Callable, Literal, TypeVar, Union

from pydantic import Field

from chaos.faults.base import Fault, FaultParams

__all__ = ["register", "get", "kinds", "fault_union", "build_fault", "load_builtin_faults"]

_REGISTRY: dict[str, type[Fault]] = {}
FaultT = TypeVar("FaultT", bound=type[Fault])


def register(kind: str) -> Callable[[FaultT], FaultT]:
    """Class decorator: register a Fault subclass under the YAML name ``kind``.

    The class must set ``params_model`` to a FaultParams subclass whose ``kind`` field is
    ``Literal[kind]``; its ``needs`` (capability names, chaos/stack/capabilities.py) must be
    known names.

    Raises:
        TypeError: the class or its params model does not fit.
        ValueError: ``kind`` is already registered to another class.
    """

    def deco(cls: FaultT) -> FaultT:
        if not (isinstance(cls, type) and issubclass(cls, Fault)):
            raise TypeError(f"@register({kind!r}) needs a Fault subclass, got {cls!r}")
        params = getattr(cls, "params_model", None)
        if not (isinstance(params, type) and issubclass(params, FaultParams)):
            raise TypeError(f"{cls.__name__}.params_model must be a FaultParams subclass")
        ann = params.model_fields["kind"].annotation
        if typing.get_origin(ann) is not Literal or typing.get_args(ann) != (kind,):
            raise TypeError(f"{params.__name__}.kind must be Literal[{kind!r}], got {ann!r}")
        from chaos.stack.capabilities import is_known

        unknown = [n for need in cls.needs for n in need.split("|") if not is_known(n)]
        if unknown:
            raise TypeError(f"{cls.__name__}.needs names unknown capabilities {unknown}; add them to "
                            "chaos/stack/capabilities.py CAPABILITIES")
        old = _REGISTRY.get(kind)
        if old is not None and old.__qualname__ != cls.__qualname__:
            raise ValueError(f"fault kind {kind!r} is already registered by {old.__qualname__}")
        cls.kind = kind
        _REGISTRY[kind] = cls
        return cls

    return deco


def load_builtin_faults() -> None:
    """Import every fault module of the ``chaos.faults`` package (idempotent)."""
    import chaos.faults as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name in ("base", "registry") or info.name.startswith("_"):
            continue
        importlib.import_module(f"{pkg.__name__}.{info.name}")


def kinds() -> list[str]:
    """Registered kinds, sorted."""
    return sorted(_REGISTRY)


def get(kind: str) -> type[Fault]:
    """The Fault class for ``kind``. Raises KeyError naming the known kinds."""
    try:
        return _REGISTRY[kind]
    except KeyError:
        raise KeyError(f"unknown fault kind {kind!r}; known: {', '.join(kinds())}") from None


def fault_union() -> Any:
    """``Annotated[Union[<params models>], Field(discriminator="kind")]`` over the registry.

    Call after :func:`load_builtin_faults`. Raises RuntimeError when nothing is registered.
    """
    if not _REGISTRY:
        raise RuntimeError("no fault kinds registered (call load_builtin_faults() first)")
    models = tuple(_REGISTRY[k].params_model for k in kinds())
    member = models[0] if len(models) == 1 else Union[models]  # noqa: UP007 - dynamic union
    return Annotated[member, Field(discriminator="kind")]


def build_fault(params: FaultParams) -> Fault:
    """Instantiate the registered Fault class for validated ``params``."""
    return get(params.kind)(params)
