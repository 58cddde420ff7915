"""Hugging Face media columns whose rows name a file instead of holding its bytes: the files read into them.

``datasets`` stores an image, an audio clip or a video as a struct of ``bytes`` and ``path``, and may leave the
bytes out when the file was not loaded before writing. The worker reads those files before decoding, so the
codecs always see bytes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from petastorm.codecs import AudioCodec, HFImageCodec, VideoCodec
from petastorm.errors import CodecError
from petastorm.store.pieces import RowGroupPiece
from petastorm.unischema import UnischemaField

__all__ = ['resolve_media_paths']

# Codecs of Hugging Face's struct of bytes and path, whose rows may hold a path only.
_PATH_CODECS = (HFImageCodec, AudioCodec, VideoCodec)


def resolve_media_paths(fields: Sequence[UnischemaField], filesystem: pafs.FileSystem, piece: RowGroupPiece,
                        table: pa.Table) -> pa.Table:
    """``table`` with the files of Hugging Face image, audio and video columns stored as a path only read from it.

    ``datasets`` may store an image (an audio, a video) as its file's path instead of its bytes. A relative path is
    taken relative to the data file's directory, then its file name alone there; an absolute path as it is. Rows
    naming one file read it once.

    Args:
        fields: the fields read (those of a path codec are looked at).
        filesystem: where the data file, and the files its rows name, are.
        piece: the row group the table holds.
        table: its columns as stored.

    Raises:
        CodecError: no file is found for a path (naming the field, the data file, the row group, the row and the
            places looked at).
    """
    for field in fields:
        if not isinstance(field.codec, _PATH_CODECS) or field.name not in table.column_names:
            continue
        column = table.column(field.name).combine_chunks()
        if not pa.types.is_struct(column.type) or column.type.get_field_index('path') < 0:
            continue
        payloads = column.field('bytes')
        if not payloads.null_count:
            continue
        paths = column.field('path').to_pylist()
        row_valid = column.is_valid().to_pylist()
        filled = payloads.to_pylist()
        kind = getattr(field.codec, 'media_kind', 'image')
        files: dict[str, bytes] = {}
        for row, payload in enumerate(filled):
            if payload is None and row_valid[row] and paths[row] is not None:
                if paths[row] not in files:
                    files[paths[row]] = _read_media_file(filesystem, piece, field.name, row, paths[row], kind)
                filled[row] = files[paths[row]]
        resolved = pa.StructArray.from_arrays(
            [pa.array(filled, type=pa.binary()), column.field('path')], names=['bytes', 'path'],
            mask=pa.array([not ok for ok in row_valid]) if column.null_count else None)
        table = table.set_column(table.column_names.index(field.name), field.name, resolved)
    return table


def _read_media_file(filesystem: pafs.FileSystem, piece: RowGroupPiece, name: str, row: int, path: str,
                     kind: str = 'image') -> bytes:
    directory = posixpath.dirname(piece.path)
    candidates = [path] if path.startswith('/') else []
    candidates += [posixpath.join(directory, path), posixpath.join(directory, posixpath.basename(path))]
    for candidate in dict.fromkeys(candidates):
        try:
            with filesystem.open_input_file(candidate) as handle:
                return bytes(handle.read())
        except (FileNotFoundError, OSError):
            continue
    raise CodecError(f'field {name!r}, row {row} of row group {piece.row_group} of {piece.path}: the {kind} is stored '
                     f'as the path {path!r} only, and no file is at {", ".join(dict.fromkeys(candidates))}; keep the '
                     f'{kind} files next to the data file (paths are taken relative to it), or write the dataset with '
                     f'the {kind} files embedded (datasets embeds them when they are loaded before to_parquet)')
