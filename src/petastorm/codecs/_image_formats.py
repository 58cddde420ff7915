"""What an encoded PNG or JPEG holds, read from its header without decoding it.

The layout (size, channels, sample type) lets a decoder write straight into the image's row of a preallocated
column, and tells whether the file is one of the plain kinds every decoder turns into the same pixels.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Literal

import numpy as np

PNG_SIGNATURE = b'\x89PNG\r\n\x1a\n'
JPEG_SIGNATURE = b'\xff\xd8'
_PNG_END = b'\x00\x00\x00\x00IEND\xaeB`\x82'

# PNG colour types (IHDR) and the channels OpenCV's IMREAD_UNCHANGED returns for them.
_PNG_GREY, _PNG_RGB, _PNG_RGBA = 0, 2, 6
_PNG_CHANNELS = {_PNG_GREY: 1, _PNG_RGB: 3, _PNG_RGBA: 4}

# Start-of-frame markers (baseline, extended, progressive, lossless; Huffman or arithmetic coded).
_JPEG_SOF = frozenset((0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF))
_JPEG_STANDALONE = frozenset((0x01, *range(0xD0, 0xD8)))
_JPEG_START_OF_SCAN = 0xDA


@dataclass(frozen=True)
class ImageLayout:
    """The decoded shape and dtype of a plain image, as OpenCV's ``IMREAD_UNCHANGED`` decode gives them.

    Only plain, complete images get a layout: PNG of grey, RGB or RGBA samples of 8 or 16 bits without a
    transparency chunk, and 8-bit JPEG of 1 (grey) or 3 (colour) components. Everything else (palettes, 1-4
    bit greys, grey + alpha, tRNS, CMYK, 12-bit JPEG, files cut short) has none and goes to the reference path.
    """

    kind: Literal['png', 'jpeg']
    height: int
    width: int
    channels: int
    dtype: np.dtype

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.height, self.width) if self.channels == 1 else (self.height, self.width, self.channels)


def plain_layout(payload: memoryview | bytes) -> ImageLayout | None:
    """The layout of a plain PNG or JPEG (see :class:`ImageLayout`), else None (also for unreadable headers)."""
    if isinstance(payload, memoryview) and payload.format != 'B':
        payload = payload.cast('B')  # indexing must give unsigned bytes (an Arrow buffer's view gives signed ones)
    head = bytes(payload[:8])
    if head == PNG_SIGNATURE:
        return _png_layout(payload)
    if head[:2] == JPEG_SIGNATURE:
        return _jpeg_layout(payload)
    return None


def _png_layout(payload: memoryview | bytes) -> ImageLayout | None:
    # As for JPEG, a file without its end chunk goes to the reference path (libspng stops reading at the data).
    if len(payload) < 45 or bytes(payload[12:16]) != b'IHDR' or bytes(payload[-12:]) != _PNG_END:
        return None
    width, height, bit_depth, colour_type = struct.unpack_from('>IIBB', payload, 16)
    channels = _PNG_CHANNELS.get(colour_type)
    if channels is None or bit_depth not in (8, 16) or width == 0 or height == 0:
        return None
    # A tRNS chunk (which comes before the image data) gives OpenCV an alpha channel the header does not show.
    position = 33
    while position + 8 <= len(payload):
        length, = struct.unpack_from('>I', payload, position)
        chunk_type = bytes(payload[position + 4:position + 8])
        if chunk_type == b'IDAT':
            return ImageLayout('png', height, width, channels, np.dtype(np.uint8 if bit_depth == 8 else np.uint16))
        if chunk_type == b'tRNS':
            return None
        position += 12 + length
    return None


def _jpeg_layout(payload: memoryview | bytes) -> ImageLayout | None:
    size = len(payload)
    # A file cut short (no end-of-image marker) goes to the reference path, which refuses it; libjpeg-turbo
    # libraries differ in how much of a damaged file they accept.
    if size < 4 or bytes(payload[size - 2:]) != b'\xff\xd9':
        return None
    position = 2
    while position + 4 <= size:
        if payload[position] != 0xFF:
            return None
        marker = payload[position + 1]
        if marker == 0xFF:  # fill byte before a marker
            position += 1
            continue
        if marker in _JPEG_STANDALONE:
            position += 2
            continue
        if marker == _JPEG_START_OF_SCAN:
            return None
        length, = struct.unpack_from('>H', payload, position + 2)
        if marker in _JPEG_SOF:
            if position + 10 > size:
                return None
            precision, height, width, components = struct.unpack_from('>BHHB', payload, position + 4)
            if precision != 8 or height == 0 or width == 0 or components not in (1, 3):
                return None
            return ImageLayout('jpeg', height, width, components, np.dtype(np.uint8))
        position += 2 + length
    return None
