"""Weights stored inside the .onnx file, left there as byte ranges: fused without parsing them.

Parsing a 1.5 GB model into Python objects, inferring shapes on it and writing it back costs
about five times the file in memory. Instead, one scan of the protobuf wire format finds the
large ``raw_data`` of the main graph's initializers and reads the model with each of them
turned into an external-data reference into the .onnx file itself (``location`` = its name,
``offset``/``length`` = where the bytes lie). Everything downstream (shape inference, onnx-ir,
``--verify`` in onnxruntime) already handles external data, so the weights are never copied
into memory. ``save`` writes OUT with those tensors inline again, streaming their bytes from IN.

Wire format (protobuf): each field is a varint key (field number << 3 | wire type) followed by
a varint (type 0), 8 bytes (1), a varint length and that many bytes (2), or 4 bytes (5).
ModelProto.graph is field 7, GraphProto.initializer 5, TensorProto.raw_data 9, external_data 13,
data_location 14. Fields may come in any order; a message is the concatenation of its fields.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import onnx
import onnx.external_data_helper

from . import onnx_io
from .errors import InvalidModelError

THRESHOLD = 1024  # raw_data of this many bytes or more stays in the file (onnx's own default)
_MODEL_GRAPH, _GRAPH_INITIALIZER = 7, 5
_RAW_DATA, _EXTERNAL_DATA, _DATA_LOCATION = 9, 13, 14
_LENGTH_DELIMITED = 2
_PROTOBUF_LIMIT = 2**31 - 1  # protobuf cannot parse a message this large
_CHUNK = 16 * 2**20
_MAX_FIELDS = 2_000_000  # per message scanned, far above any real graph's node count


class _Malformed(Exception):
    """The scan met bytes that are not valid wire format: the ordinary loader reports why."""


class WeightsInFile:
    """A model read with its large inline weights left in the file (``os.PathLike`` of it).

    ``proto`` refers to them as external data at ``location`` = the file's name; ``ranges`` are
    the (offset, length) pairs so referred to, which no other external data can be.
    """

    def __init__(self, path: Path, proto: onnx.ModelProto, ranges: set[tuple[int, int]]) -> None:
        self.path = path
        self.proto = proto
        self.ranges = ranges

    def __fspath__(self) -> str:
        return str(self.path)

    def __str__(self) -> str:
        return str(self.path)

    def range_of(self, tensor: onnx.TensorProto) -> tuple[int, int] | None:
        """The (offset, length) in the file of a tensor left there, else None."""
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return None
        info = {e.key: e.value for e in tensor.external_data}
        if info.get("location") != self.path.name:
            return None
        try:
            key = (int(info.get("offset", "0")), int(info.get("length", "-1")))
        except ValueError:
            return None
        return key if key in self.ranges else None


class _File:
    """Random access to a file's bytes by index and slice, read with pread in small blocks:
    only the bytes the scan looks at are read (an mmap would map whole large pages of them)."""

    _BLOCK = 64 * 1024

    def __init__(self, fd: int, size: int) -> None:
        self._fd, self._size = fd, size
        self._start, self._block = 0, b""

    def __len__(self) -> int:
        return self._size

    def __getitem__(self, index: int | slice) -> int | bytes:
        if isinstance(index, slice):
            return os.pread(self._fd, index.stop - index.start, index.start)
        if not self._start <= index < self._start + len(self._block):
            self._start, self._block = index, os.pread(self._fd, self._BLOCK, index)
            if not self._block:
                raise _Malformed
        return self._block[index - self._start]


# Protobuf's decoder (upb) reads a field's key and a length as 32-bit varints of at most 5 bytes,
# a length below 2**31 and a field number below 2**29; other varints take at most 10 bytes.
_MAX_VARINT, _MAX_VARINT32 = 10, 5
_MAX_LENGTH, _MAX_FIELD = 2**31 - 1, 2**29 - 1


def _varint(buf: _File | bytes, pos: int, end: int, size: int = _MAX_VARINT) -> tuple[int, int]:
    value = shift = 0
    for _ in range(size):
        if pos >= end:
            raise _Malformed
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _Malformed  # longer than protobuf reads


def _fields(buf: _File | bytes, pos: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, start of the field, start of its value, end) for each field in a message;
    the value of a length-delimited field is ``buf[value:end]``."""
    count = 0
    while pos < end:
        count += 1
        if count > _MAX_FIELDS:  # no real graph has this many: leave such a file to protobuf
            raise _Malformed
        start = pos
        key, pos = _varint(buf, pos, end, _MAX_VARINT32)
        field, wire = key >> 3, key & 7
        if wire == 0:
            _, pos = _varint(buf, pos, end)
            value = pos
        elif wire == 1 or wire == 5:
            value = pos
            pos += 8 if wire == 1 else 4
        elif wire == _LENGTH_DELIMITED:
            length, value = _varint(buf, pos, end, _MAX_VARINT32)
            if length > _MAX_LENGTH:
                raise _Malformed
            pos = value + length
        else:  # groups (3, 4): deprecated, never in ONNX files
            raise _Malformed
        if not 0 < field <= _MAX_FIELD or pos > end:
            raise _Malformed
        yield field, start, value, pos


def _key(field: int, wire: int = _LENGTH_DELIMITED) -> bytes:
    return _encode_varint(field << 3 | wire)


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(field: int, payload: bytes) -> bytes:
    return _key(field) + _encode_varint(len(payload)) + payload


def _tensor(buf: _File, start: int, end: int, location: str, ranges: set) -> bytes | None:
    """The tensor's bytes with its raw_data replaced by a reference to where it lies; None to
    keep the tensor as it is (small, already external, or data in typed fields)."""
    raw: list[tuple[int, int]] = []
    kept = bytearray()
    for field, f_start, value, f_end in _fields(buf, start, end):
        if field in (_EXTERNAL_DATA, _DATA_LOCATION):
            return None
        if field == _RAW_DATA:
            raw.append((value, f_end))
        else:
            kept += buf[f_start:f_end]
    if len(raw) != 1 or raw[0][1] - raw[0][0] < THRESHOLD:
        return None
    offset, length = raw[0][0], raw[0][1] - raw[0][0]
    ranges.add((offset, length))
    for key, value in (("location", location), ("offset", str(offset)), ("length", str(length))):
        entry = onnx.StringStringEntryProto(key=key, value=value).SerializeToString()
        kept += _delimited(_EXTERNAL_DATA, entry)
    kept += _key(_DATA_LOCATION, 0) + _encode_varint(onnx.TensorProto.EXTERNAL)
    return bytes(kept)


def _graph(buf: _File, start: int, end: int, location: str, ranges: set) -> bytes:
    out = bytearray()
    for field, f_start, value, f_end in _fields(buf, start, end):
        if field == _GRAPH_INITIALIZER and f_end - value >= THRESHOLD:
            tensor = _tensor(buf, value, f_end, location, ranges)
            if tensor is not None:
                out += _delimited(_GRAPH_INITIALIZER, tensor)
                continue
        out += buf[f_start:f_end]
    return bytes(out)


def is_model_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file at ``path`` is, by its bytes, a model: a protobuf message whose top-level
    fields run to its end with one graph among them, whatever its name. Only the fields' keys
    and lengths are read (a data file of weights fails within its first bytes: a key of field 0,
    or a group's wire type)."""
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO is never opened: it could block
            return False
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size == 0:
            return False
        buf = _File(fd, st.st_size)
        graphs = 0
        for field, start, _, _ in _fields(buf, 0, st.st_size):
            if field == _MODEL_GRAPH:
                if buf[start] & 7 != _LENGTH_DELIMITED:
                    return False
                graphs += 1
        return graphs == 1
    except (OSError, _Malformed):
        return False
    finally:
        os.close(fd)


def read(path: str | os.PathLike[str]) -> WeightsInFile:
    """The model at ``path`` without its weights: large inline ones left in the file (see
    ``leave_in_file``), external ones not loaded; unreadable files raise the ordinary loader's
    one-line errors."""
    found = leave_in_file(path)
    if found is not None:
        return found
    return WeightsInFile(Path(path), onnx_io.load_model(path, load_external_data=False), set())


def leave_in_file(path: str | os.PathLike[str]) -> WeightsInFile | None:
    """The model at ``path`` with its large inline weights left in the file; None where there
    are none, or where the file is not a plain readable model (the ordinary loader then reads
    it, or reports why it cannot)."""
    p = Path(path)
    try:
        st = p.stat()
        if not p.is_file() or st.st_size < THRESHOLD or st.st_nlink > 1:
            return None  # onnx-ir refuses to read data from files with several links
        # The ranges are read from the file's real folder: a symlink to a file elsewhere (a
        # Hugging Face cache's blob) would otherwise point outside the folder it is read from.
        real = Path(os.path.realpath(p))
        moved = real.parent != Path(os.path.realpath(p.parent))
        with open(real, "rb") as f:
            found = _leave_in_file(real if moved else p, _File(f.fileno(), st.st_size))
    except (OSError, ValueError, _Malformed):
        return None
    if found is not None and moved:
        tensors = onnx_io.all_tensors(found.proto)
        if any(t.data_location == onnx.TensorProto.EXTERNAL and not found.range_of(t)
               for t in tensors):  # fmt: skip
            return None  # its external data lies beside the link: read it as before
    return found


def _leave_in_file(path: Path, buf: _File) -> WeightsInFile | None:
    ranges: set[tuple[int, int]] = set()
    out = bytearray()
    graphs = 0
    for field, f_start, value, f_end in _fields(buf, 0, len(buf)):
        if field == _MODEL_GRAPH:
            if buf[f_start] & 7 != _LENGTH_DELIMITED:  # protobuf keeps it as an unknown field
                raise _Malformed
            graphs += 1
            graph = _graph(buf, value, f_end, path.name, ranges)
            out += _delimited(_MODEL_GRAPH, graph)
        else:
            out += buf[f_start:f_end]
    if graphs != 1 or not ranges:
        return None  # nothing to leave in the file (or several graph fields, merged by parsers)
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(bytes(out))
    except Exception:  # protobuf's DecodeError and kin: the ordinary loader explains
        return None
    if not proto.graph.node and not proto.graph.output:
        return None
    return WeightsInFile(path, proto, ranges)


def _copy_range(src: int, dst: int, offset: int, length: int) -> None:
    """Append ``length`` bytes of ``src`` from ``offset`` to ``dst``, in the kernel if it can."""
    while length > 0:
        try:
            done = os.copy_file_range(src, dst, min(length, 2**30), offset)
        except (AttributeError, OSError):  # not Linux, or across filesystems it cannot
            done = 0
        if done <= 0:
            break
        offset, length = offset + done, length - done
    while length > 0:
        chunk = os.pread(src, min(length, _CHUNK), offset)
        if not chunk:
            raise InvalidModelError("the input file became shorter while it was being read")
        _write_all(dst, chunk)
        offset, length = offset + len(chunk), length - len(chunk)


def save(model: onnx.ModelProto, source: WeightsInFile, dst: str | os.PathLike[str]) -> None:
    """Write ``model`` to ``dst`` (a new file) with the tensors ``source`` left in the file inline
    again, their bytes streamed from it; other tensors are written as they are."""
    head = onnx.ModelProto()
    head.CopyFrom(model)  # small: the weights are references
    head.graph.ClearField("initializer")
    pieces: list[tuple[bytes, tuple[int, int] | None]] = []
    for tensor in model.graph.initializer:
        where = source.range_of(tensor)
        if where is None:
            pieces.append((_delimited(_GRAPH_INITIALIZER, tensor.SerializeToString()), None))
            continue
        inline = onnx.TensorProto()
        inline.CopyFrom(tensor)
        inline.ClearField("external_data")
        inline.ClearField("data_location")
        header = inline.SerializeToString() + _key(_RAW_DATA) + _encode_varint(where[1])
        size = len(header) + where[1]
        pieces.append((_key(_GRAPH_INITIALIZER) + _encode_varint(size) + header, where))
    graph = head.graph.SerializeToString()
    head.ClearField("graph")
    graph_size = len(graph) + sum(len(h) + (w[1] if w else 0) for h, w in pieces)
    prefix = head.SerializeToString() + _key(_MODEL_GRAPH) + _encode_varint(graph_size)
    if len(prefix) + graph_size > _PROTOBUF_LIMIT:
        raise InvalidModelError("the fused model would exceed protobuf's 2 GB limit")
    src = os.open(source.path, os.O_RDONLY)
    try:
        dst_fd = os.open(dst, os.O_WRONLY | os.O_TRUNC)
        try:
            _write_all(dst_fd, prefix + graph)
            for header, where in pieces:
                _write_all(dst_fd, header)
                if where is not None:
                    _copy_range(src, dst_fd, *where)
        finally:
            os.close(dst_fd)
    finally:
        os.close(src)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
