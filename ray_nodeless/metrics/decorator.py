"""The base of the metrics decorators (instrument.py): a decorator *is* the class it wraps, as Karpenter's metrics
decorator implements the CloudProvider interface it wraps.

`class MeteredLauncher(Decorator[Launcher], Launcher)` subclasses the wrapped class, so the type checker sees
`Launcher.launch` with its real signature wherever a metered launcher goes, and `isinstance(x, Launcher)` holds.
The decorator overrides, with the same signature, only the calls it meters; every other member of the wrapped class
(methods, properties, class-level hooks and defaults) is delegated to the wrapped object, installed when the
decorator class is made, so the wrapped class's own code never runs against the decorator. Instance attributes
(`launcher.settings`, `view.clock`) are read from and written to the wrapped object: code and tests that reach into
`provider.view.clock` or set `provider.launcher.prefer_on_demand` see the real object.

The wrapped class's `__init__` is not called: the decorator holds no state of its own but its recorder.
"""
from __future__ import annotations

from typing import Any, ClassVar, Generic, TypeVar

T = TypeVar("T")

# Members of the wrapped classes never delegated: Python's own machinery (dunders) and abc's bookkeeping.
_SKIP_PREFIXES = ("__", "_abc_")


def _delegated(name: str) -> property:
    def get(self: Decorator[Any]) -> Any:
        return getattr(object.__getattribute__(self, "_inner"), name)

    def put(self: Decorator[Any], value: object) -> None:
        setattr(object.__getattribute__(self, "_inner"), name, value)

    return property(get, put, doc=f"The wrapped object's `{name}`.")


class Decorator(Generic[T]):
    """Subclass as `class MeteredX(Decorator[X], X)`. `_own`: the instance attributes the decorator keeps itself
    (set them with `object.__setattr__`; any other write goes to the wrapped object)."""

    _own: ClassVar[tuple[str, ...]] = ("_inner",)
    _inner: T

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        mine = set(cls.__dict__) | set(vars(Decorator)) | set(cls._own)
        for base in cls.__mro__[1:]:
            if issubclass(Decorator, base) or issubclass(base, Decorator):     # object, Generic, ourselves
                continue
            for name in vars(base):
                if name in mine or name.startswith(_SKIP_PREFIXES):
                    continue
                setattr(cls, name, _delegated(name))
                mine.add(name)

    def __init__(self, inner: T) -> None:
        object.__setattr__(self, "_inner", inner)

    def __getattr__(self, name: str) -> Any:
        # Only for what no class defines: the wrapped object's instance attributes.
        return getattr(object.__getattribute__(self, "_inner"), name)

    def __setattr__(self, name: str, value: object) -> None:
        if name in type(self)._own:
            object.__setattr__(self, name, value)
        else:
            setattr(object.__getattribute__(self, "_inner"), name, value)

    @property
    def wrapped(self) -> T:
        inner: T = object.__getattribute__(self, "_inner")
        return inner
