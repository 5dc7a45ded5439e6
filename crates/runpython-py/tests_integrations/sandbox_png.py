"""Sandboxed code that displays an image, made without a plotting library, and a check of what arrives."""

from __future__ import annotations

import struct

# Displays a 3x2 red PNG built with zlib and struct (`display` is a builtin in runs), then returns 'drawn'.
PNG_CODE = """
import struct, zlib
def chunk(kind, data):
    return struct.pack('>I', len(data)) + kind + data + struct.pack('>I', zlib.crc32(kind + data))
rows = b''.join(b'\\x00' + b'\\xff\\x00\\x00' * 3 for _ in range(2))
png = (b'\\x89PNG\\r\\n\\x1a\\n' + chunk(b'IHDR', struct.pack('>IIBBBBB', 3, 2, 8, 2, 0, 0, 0))
       + chunk(b'IDAT', zlib.compress(rows)) + chunk(b'IEND', b''))
class Picture:
    def _repr_png_(self):
        return png
display(Picture())
'drawn'
"""


def png_size(data: bytes) -> tuple[int, int]:
    """The width and height of a PNG, after checking its signature."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", data[:8]
    width, height = struct.unpack(">II", data[16:24])
    return int(width), int(height)
