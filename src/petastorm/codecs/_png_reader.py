"""Our own PNG reader for plain images: libdeflate inflates, compiled row filters rebuild the pixels.

PNG decoding is two steps: inflating the zlib stream of the image data, then undoing each row's filter. libpng
and libspng spend most of their time in zlib's inflate; libdeflate (which ``imagecodecs`` ships) inflates the
same stream two to three times faster when the whole output size is known, which a PNG header gives. The row
filters run in :mod:`petastorm.codecs._png_rows` and write the pixels straight into the caller's buffer. Python
holds the GIL only to make the three calls.

Only plain images (:class:`~petastorm.codecs._image_formats.ImageLayout`) that are not interlaced are read here.
For those, the reader checks what libpng checks: the CRC of the header and of every image-data chunk (in the
compiled module, which also joins the chunks), the zlib stream's Adler-32 (libdeflate), the exact amount of image
data, and the filter types. Anything else raises ``ValueError``, and the caller hands the file to the other
decoders (OpenCV has the last word on what is corrupt).

The module imports only when both ``imagecodecs`` and the compiled module are there.
"""

from __future__ import annotations

import threading

import imagecodecs
import numpy as np

from petastorm.codecs import _png_rows
from petastorm.codecs._image_formats import ImageLayout


class PngReader:
    """Decodes plain, non-interlaced PNG files; one instance serves every thread of a process."""

    def __init__(self) -> None:
        # Each thread keeps its two work buffers (image data as stored, then inflated) between images: allocating
        # them per image costs page faults that are a visible part of decoding a small image.
        self._scratch = threading.local()

    def decode(self, payload: memoryview, layout: ImageLayout, out: np.ndarray | None) -> np.ndarray:
        """The image's pixels as OpenCV gives them (RGB, grey, or BGRA), in ``out`` when it is given.

        Raises:
            ValueError: the file is interlaced, damaged, or not what ``layout`` says.
        """
        view = memoryview(payload).cast('B')
        if bytes(view[12:16]) != b'IHDR' or view[26] or view[27] or view[28]:
            raise ValueError('PNG reader: not a non-interlaced PNG of the standard compression and filter method')
        stored = self._buffer('stored', len(view))
        stream = stored[:_png_rows.gather(view, stored)]
        sample_bytes = layout.dtype.itemsize
        row_bytes = layout.width * layout.channels * sample_bytes
        expected = layout.height * (row_bytes + 1)
        try:
            # imagecodecs' stubs name bytes-like types only; it reads any buffer.
            raw = imagecodecs.deflate_decode(stream, out=self._buffer('inflated', expected))  # type: ignore[arg-type]
        except imagecodecs.DeflateError as err:
            raise ValueError(f'PNG reader: the image data does not inflate to {expected} bytes ({err})') from err
        if len(raw) != expected:
            raise ValueError(f'PNG reader: {len(raw)} bytes of image data, expected {expected}')
        if out is None or not out.flags.c_contiguous:
            out = np.empty(layout.shape, layout.dtype)
        _png_rows.unfilter(raw, out, layout.height, row_bytes, layout.channels * sample_bytes, sample_bytes,
                           layout.channels == 4)
        return out

    def _buffer(self, name: str, size: int) -> memoryview:
        buffer = getattr(self._scratch, name, None)
        if buffer is None or len(buffer) < size:
            buffer = bytearray(size)
            setattr(self._scratch, name, buffer)
        return memoryview(buffer)[:size]
