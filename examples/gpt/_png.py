"""A tiny RGB canvas and PNG writer (zlib only), for drawing the loss curves where matplotlib is
not installed: lines, rectangles and text in a 3x5 pixel font of our own, scaled up."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

Color = tuple[int, int, int]

# Each glyph: five rows of three pixels, "1" = ink. Upper case only; unknown characters are blank.
_GLYPHS = {
    "0": "111/101/101/101/111",
    "1": "010/110/010/010/111",
    "2": "111/001/111/100/111",
    "3": "111/001/111/001/111",
    "4": "101/101/111/001/001",
    "5": "111/100/111/001/111",
    "6": "111/100/111/101/111",
    "7": "111/001/001/010/010",
    "8": "111/101/111/101/111",
    "9": "111/101/111/001/111",
    "A": "010/101/111/101/101",
    "B": "110/101/110/101/110",
    "C": "011/100/100/100/011",
    "D": "110/101/101/101/110",
    "E": "111/100/110/100/111",
    "F": "111/100/110/100/100",
    "G": "011/100/101/101/011",
    "H": "101/101/111/101/101",
    "I": "111/010/010/010/111",
    "J": "001/001/001/101/010",
    "K": "101/101/110/101/101",
    "L": "100/100/100/100/111",
    "M": "101/111/111/101/101",
    "N": "110/101/101/101/101",
    "O": "010/101/101/101/010",
    "P": "110/101/110/100/100",
    "Q": "010/101/101/110/011",
    "R": "110/101/110/101/101",
    "S": "011/100/010/001/110",
    "T": "111/010/010/010/010",
    "U": "101/101/101/101/111",
    "V": "101/101/101/101/010",
    "W": "101/101/111/111/101",
    "X": "101/101/010/101/101",
    "Y": "101/101/010/010/010",
    "Z": "111/001/010/100/111",
    ".": "000/000/000/000/010",
    ",": "000/000/000/010/100",
    "-": "000/000/111/000/000",
    "+": "000/010/111/010/000",
    "%": "101/001/010/100/101",
    ":": "000/010/000/010/000",
    "/": "001/001/010/100/100",
    "(": "010/100/100/100/010",
    ")": "010/001/001/001/010",
    "=": "000/111/000/111/000",
    "_": "000/000/000/000/111",
}


class Canvas:
    """``width`` x ``height`` RGB pixels, origin top-left, filled with ``background``."""

    def __init__(self, width: int, height: int, background: Color = (255, 255, 255)) -> None:
        if width < 1 or height < 1:
            raise ValueError(f"Canvas: width, height: expected >= 1, got {width} x {height}")
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i : i + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color, fill: bool = False) -> None:
        """The rectangle with corners (x0, y0), (x1, y1) inclusive; its outline unless ``fill``."""
        for y in range(y0, y1 + 1):
            if fill or y in (y0, y1):
                for x in range(x0, x1 + 1):
                    self.set(x, y, color)
            else:
                self.set(x0, y, color)
                self.set(x1, y, color)

    def line(self, x0: float, y0: float, x1: float, y1: float, color: Color, width: int = 1) -> None:
        """A straight segment, ``width`` pixels thick, sampled once per pixel of its length."""
        n = max(1, int(max(abs(x1 - x0), abs(y1 - y0))))
        for i in range(n + 1):
            x = round(x0 + (x1 - x0) * i / n)
            y = round(y0 + (y1 - y0) * i / n)
            for d in range(width):
                self.set(x, y + d - width // 2, color)

    def text(self, x: int, y: int, s: str, color: Color = (0, 0, 0), scale: int = 2) -> int:
        """Draws ``s`` with its top-left corner at (x, y); returns the x after its last glyph."""
        for ch in s.upper():
            rows = _GLYPHS.get(ch, "000/000/000/000/000").split("/")
            for r, bits in enumerate(rows):
                for c, bit in enumerate(bits):
                    if bit == "1":
                        px, py = x + c * scale, y + r * scale
                        self.rect(px, py, px + scale - 1, py + scale - 1, color, fill=True)
            x += 4 * scale
        return x

    def save(self, path: str | Path) -> None:
        """Writes an 8-bit RGB PNG (no filtering, zlib level 9)."""
        row = 3 * self.width
        raw = b"".join(b"\x00" + self.pixels[y * row : (y + 1) * row] for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        png = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9))
        Path(path).write_bytes(png + chunk(b"IEND", b""))
