"""One way to write a typed JSON section and to read it back: the sections of manifest.json and of
validation.json (and the validation document itself) are all written and read here.

A ``Section`` is a dataclass whose ``to_json()`` gives its fields' keys in field order, then the keys
this vitedge does not know (``more``, kept as read), and whose ``from_json()`` reads them back, so
reading and writing a document changes nothing in it. Two ways to leave a key out:

- a field holding ``ABSENT`` (an optional key that is not in the file) is written as no key;
- a field named in ``OMIT_NONE`` is written as no key while it is None.

A key missing from the file reads as the field's default, or as ``ABSENT`` when the field has none.

Values are turned into JSON by their field's declared type, through one registry: a field typed as a
section (or ``list[...]``/``dict[str, ...]`` of one) is written with its ``to_json()``; a field typed as
a type given to ``register_codec`` with that codec; every other value is already JSON and is written
as it is. A section whose keys vary (``ValuesSection``) keeps its values in order.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypeVar, get_type_hints

JsonDict = dict[str, Any]
S = TypeVar("S", bound="Section")
V = TypeVar("V", bound="ValuesSection")


class _Absent:
    """An optional key that is not in the document (written as no key, not as null)."""

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> bool:
        return False


ABSENT: Any = _Absent()


@dataclass(frozen=True)
class Codec:
    """How values of one non-JSON type are written and read back."""

    encode: Callable[[Any], Any]
    decode: Callable[[Any], Any]


_CODECS: dict[type, Codec] = {}


def register_codec(kind: type, encode: Callable[[Any], Any], decode: Callable[[Any], Any]) -> None:
    """Write values of ``kind`` with ``encode`` and read them back with ``decode`` wherever a section names the type."""
    _CODECS[kind] = Codec(encode, decode)


def _codec(kind: object) -> Codec | None:
    if isinstance(kind, type) and issubclass(kind, (Section, ValuesSection)):
        return Codec(lambda v: v.to_json(), kind.from_json)
    return _CODECS.get(kind) if isinstance(kind, type) else None


def _without_none(kind: object) -> object:
    """``X | None`` -> X (the codec of an optional value is its type's)."""
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        rest = [a for a in typing.get_args(kind) if a is not type(None)]
        return rest[0] if len(rest) == 1 else kind
    return kind


def _field_codec(kind: object) -> Callable[[Any, bool], Any] | None:
    """A function (value, writing) -> value for a field of type ``kind``; None when its values are JSON already."""
    kind = _without_none(kind)
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    inner = _codec(args[-1]) if origin in (list, dict) and args else None
    if origin is list and inner:
        return lambda v, w: [(inner.encode if w else inner.decode)(x) for x in v] if isinstance(v, list) else v
    if origin is dict and inner:
        return lambda v, w: ({k: (inner.encode if w else inner.decode)(x) for k, x in v.items()
                              if w or isinstance(x, dict)} if isinstance(v, dict) else v)
    codec = _codec(kind)
    if codec:
        return lambda v, w: codec.encode(v) if w else codec.decode(v)
    return None


def _plan(cls: type) -> list[tuple[str, Callable[[Any, bool], Any] | None, Callable[[], Any]]]:
    """(name, codec, the value when the key is missing) of each field but ``more``, in order; cached per class."""
    cached = cls.__dict__.get("_section_plan")
    if cached is None:
        hints = get_type_hints(cls)
        cached = []
        for f in dataclasses.fields(cls):
            if f.name == "more":
                continue
            if f.default is not dataclasses.MISSING:
                missing: Callable[[], Any] = lambda d=f.default: d
            elif f.default_factory is not dataclasses.MISSING:
                missing = f.default_factory
            else:
                missing = lambda: ABSENT  # noqa: E731
            cached.append((f.name, _field_codec(hints[f.name]), missing))
        cls._section_plan = cached  # type: ignore[attr-defined]
    return cached


def as_object(value: object) -> JsonDict:
    """A JSON object as a new dict; anything else (a malformed document) as an empty one."""
    return dict(value) if isinstance(value, dict) else {}


@dataclass
class Section:
    """A section with named keys: to_json/from_json over the dataclass fields, in order."""

    key: ClassVar[str] = ""  # the section's key in its document
    OMIT_NONE: ClassVar[tuple[str, ...]] = ()  # keys written only when not None
    more: JsonDict = field(default_factory=dict, kw_only=True)  # keys this vitedge does not know, kept as read

    def to_json(self) -> JsonDict:
        out: JsonDict = {}
        for name, codec, _ in _plan(type(self)):
            value = getattr(self, name)
            if value is ABSENT or (value is None and name in self.OMIT_NONE):
                continue
            out[name] = codec(value, True) if codec and value is not None else value
        out.update(self.more)
        return out

    @classmethod
    def not_an_object(cls, data: object) -> JsonDict:
        """What a section that is not a JSON object reads as: empty here; a manifest section refuses it."""
        return {}

    @classmethod
    def from_json(cls: type[S], data: object) -> S:
        data = data if isinstance(data, dict) else cls.not_an_object(data)
        values: JsonDict = {}
        for name, codec, missing in _plan(cls):
            if name in data:
                value = data[name]
                values[name] = codec(value, False) if codec and value is not None else value
            else:
                values[name] = missing()
        names = {name for name, _, _ in _plan(cls)}
        return cls(**values, more={k: v for k, v in data.items() if k not in names})


class ValuesSection:
    """A section whose keys vary: its values in order; the ones readers use are named by ``value(key)`` properties."""

    def __init__(self, values: JsonDict | None = None) -> None:
        self.values: JsonDict = as_object(values)

    def get(self, key: str, default: object = None) -> Any:
        return self.values.get(key, default)

    def to_json(self) -> JsonDict:
        return dict(self.values)

    @classmethod
    def from_json(cls: type[V], data: object) -> V:
        return cls(as_object(data))

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and other.values == self.values  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.values!r})"


def value(key: str) -> property:
    """The ``key`` of a ValuesSection as an attribute: None when absent."""
    return property(lambda self: self.values.get(key), doc=f"the document's ``{key}``, None when absent")
