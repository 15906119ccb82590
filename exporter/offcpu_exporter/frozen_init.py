"""A quicker __init__ for the frozen, slotted dataclasses a flush makes by the thousand.

A frozen dataclass's generated __init__ stores each field with `object.__setattr__(self, name,
value)` (its own __setattr__ raises): a global lookup, an attribute lookup and a search of the
class for the slot, per field. Counters, stack samples and process views are made for every
process at every flush (tens of thousands on a large node), and those stores were about half of
the time of making one. The __init__ made here stores through each slot's descriptor, found once
when the class is decorated; the signature, the defaults, the default factories, __post_init__ and
the frozen __setattr__ are those of the dataclass.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

__all__ = ["quick_init"]

T = TypeVar("T")

_NO_VALUE = object()  # a field with a default factory was not given


def quick_init(cls: type[T]) -> type[T]:
    """Class decorator, above @dataclass(frozen=True, slots=True)."""
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__:
        raise TypeError(f"{cls.__name__}: quick_init is for frozen dataclasses with slots")
    scope: dict[str, Any] = {"_NO_VALUE": _NO_VALUE}
    args: list[str] = []
    body: list[str] = []
    for i, f in enumerate(dataclasses.fields(cls)):  # type: ignore[arg-type]
        if f.kw_only:
            raise TypeError(f"{cls.__name__}.{f.name}: keyword-only fields are not supported")
        store = f"_store{i}"
        scope[store] = cls.__dict__[f.name].__set__  # the slot's member descriptor
        value = f.name
        if f.default is not dataclasses.MISSING:
            scope[f"_default{i}"] = f.default
            value = f"_default{i}"
        elif f.default_factory is not dataclasses.MISSING:
            scope[f"_factory{i}"] = f.default_factory
            value = f"_factory{i}()"
        if not f.init:
            if value != f.name:  # (else __post_init__ sets it)
                body.append(f"    {store}(self, {value})")
            continue
        if f.default is not dataclasses.MISSING:
            args.append(f"{f.name}={value}")
            body.append(f"    {store}(self, {f.name})")
        elif f.default_factory is not dataclasses.MISSING:
            args.append(f"{f.name}=_NO_VALUE")
            body.append(f"    {store}(self, {value} if {f.name} is _NO_VALUE else {f.name})")
        else:
            args.append(f.name)
            body.append(f"    {store}(self, {f.name})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    source = f"def __init__(self, {', '.join(args)}):\n" + ("\n".join(body) or "    pass") + "\n"
    exec(source, scope)  # (made from the class's own field names, as dataclasses makes its own)
    init = scope["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__module__ = cls.__module__
    init.__doc__ = cls.__init__.__doc__
    init.__annotations__ = dict(getattr(cls.__init__, "__annotations__", {}))
    cls.__init__ = init  # type: ignore[misc,method-assign]
    return cls
