"""Mapping of user keys (ints as in Gluon, strings as in Module) to the core's 64-bit key ids."""

from __future__ import annotations

from p3kv.core.errors import ConfigError

_STRING_BIT = 1 << 63
_INT_LIMIT = 1 << 62


def key_id(key: int | str) -> int:
    """A stable id, equal on every worker: ints map to themselves, strings to a 63-bit FNV-1a hash."""
    if isinstance(key, bool) or not isinstance(key, (int, str)):
        raise ConfigError(f"key {key!r} must be an int or a str, not {type(key).__name__}")
    if isinstance(key, int):
        if not 0 <= key < _INT_LIMIT:
            raise ConfigError(f"int key {key} out of range: use 0 <= key < 2**62")
        return key
    h = 0xCBF29CE484222325
    for byte in key.encode("utf-8"):
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return _STRING_BIT | (h & (_STRING_BIT - 1))
