"""Raw frame headers for tests that speak the wire protocol to a node directly (malformed frames, impostors)."""

from __future__ import annotations

import struct

MAGIC = 0x564B3350
VERSION = 5  # kProtocolVersion (cpp/include/p3/message.h): the one place the tests spell it
NODE_FAILED, HELLO, PUSH = 7, 9, 11
LITTLE_ENDIAN, BIG_ENDIAN = 1, 2  # a HELLO's byte order (cpp/include/p3/message.h ByteOrder)
FLOAT32 = 0  # p3::DType::kFloat32


def header(command: int, *, sender: int = 0, magic: int = MAGIC, version: int = VERSION, count: int = 0,
           payload_bytes: int = 0, byte_order: int = LITTLE_ENDIAN) -> bytes:
    """A 64-byte frame header as cpp/src/codec.cc encodes it (protocol 5, layout in cpp/include/p3/message.h; a
    HELLO declares `byte_order`)."""
    order = byte_order if command == HELLO else 0
    data = struct.pack("<IHBBiiBBHIQQQQQ", magic, version, command, 0, 0, sender, FLOAT32, order, 0, 0, 0, 0, count,
                       0, payload_bytes)
    assert len(data) == 64
    return data
