"""Reading and writing ONNX files: clear errors, atomic writes, a readable IR version."""

from __future__ import annotations

import contextlib
import math
import os
import re
import secrets
import shutil
import socket
import stat
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, external_data_helper, helper

from .errors import InvalidModelError, UsageError

__all__ = [
    "NUMPY_TYPES",
    "ONNX_TYPES",
    "ORT_TYPES",
    "all_graphs",
    "all_tensors",
    "atomic_path",
    "check_external_data",
    "commit",
    "data_path",
    "external_reference",
    "hf_blobs",
    "inferred_without_weights",
    "load_model",
    "new_temp_beside",
    "output_target",
    "remove_stale_temps",
    "same_file",
    "save_model",
    "serialize",
    "set_ir_version",
    "subgraphs",
    "temp_path",
]


# The element types our tools make NumPy arrays of, as onnx's own table maps them (bfloat16 is
# ml_dtypes', a dependency of onnx): ONNX number -> dtype, dtype name ("float32", "bfloat16")
# -> ONNX number, and onnxruntime's type string ("tensor(float)") -> dtype.
NUMPY_TYPES: dict[int, np.dtype] = {
    t: np.dtype(helper.tensor_dtype_to_np_dtype(t))
    for t in (
        TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE,
        TensorProto.INT64, TensorProto.INT32, TensorProto.INT16, TensorProto.INT8,
        TensorProto.UINT64, TensorProto.UINT32, TensorProto.UINT16, TensorProto.UINT8,
        TensorProto.BOOL,
    )
}  # fmt: skip
ONNX_TYPES: dict[str, int] = {dtype.name: t for t, dtype in NUMPY_TYPES.items()}
ORT_TYPES: dict[str, np.dtype] = {
    f"tensor({TensorProto.DataType.Name(t).lower()})": dtype for t, dtype in NUMPY_TYPES.items()
}


def all_graphs(model: onnx.ModelProto) -> Iterator[onnx.GraphProto | onnx.FunctionProto]:
    """The main graph, the model's functions and every subgraph in them (If/Loop/Scan bodies)."""
    stack: list[onnx.GraphProto | onnx.FunctionProto] = [model.graph, *model.functions]
    while stack:
        graph = stack.pop()
        yield graph
        for node in graph.node:
            stack.extend(subgraphs(node))


def inferred_without_weights(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` whose initializers are only declared (as graph inputs: their data is
    never copied, so this is cheap for any model), after onnx's shape inference where it runs
    (else as declared): for reading the types of its values."""
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.functions.extend(model.functions)
    graph = light.graph
    graph.node.extend(model.graph.node)
    graph.input.extend(model.graph.input)
    declared = {i.name for i in model.graph.input}
    graph.input.extend(
        helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
        for t in model.graph.initializer
        if t.name not in declared
    )
    graph.output.extend(model.graph.output)
    graph.value_info.extend(model.graph.value_info)
    with contextlib.suppress(Exception):  # an op onnx cannot infer: what the model declares
        light = onnx.shape_inference.infer_shapes(light, strict_mode=False)
    return light


def without_defaults(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[onnx.TensorProto]]:
    """(``model`` without the initializers that are also graph inputs, those initializers):
    such a value is a default the caller may override, so nothing inferred from its data holds
    (a Reshape's target shape, an Expand's). ``model`` itself where it has none."""
    inputs = {i.name for i in model.graph.input}
    defaults = [t for t in model.graph.initializer if t.name in inputs]
    if not defaults:
        return model, []
    copy = onnx.ModelProto()
    copy.CopyFrom(model)  # (a file's weights are not in it: byte ranges or external)
    kept = [t for t in copy.graph.initializer if t.name not in inputs]
    del copy.graph.initializer[:]
    copy.graph.initializer.extend(kept)
    return copy, defaults


def subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    """The graphs a node holds in its attributes (If's branches, a Loop's or Scan's body)."""
    found = []
    for attr in node.attribute:
        if attr.type == onnx.AttributeProto.GRAPH:
            found.append(attr.g)
        elif attr.type == onnx.AttributeProto.GRAPHS:
            found.extend(attr.graphs)
    return found


def all_tensors(model: onnx.ModelProto) -> Iterator[onnx.TensorProto]:
    """Every tensor that can hold weights: initializers (main graph and subgraphs) and node
    attributes (functions too). onnx's own walk, which it keeps private: here it is named once."""
    return iter(external_data_helper._get_all_tensors(model))


def set_ir_version(model: onnx.ModelProto) -> onnx.ModelProto:
    """Stamp the lowest IR version the model's opsets allow.

    onnx's helpers stamp the newest IR version they know, which older onnxruntime releases refuse
    to read; the lowest valid one runs everywhere the opsets do.
    """
    lowest = helper.find_min_ir_version_for(list(model.opset_import), ignore_unknown=True)
    if model.functions:  # model-local functions arrived in IR 8, their overloads in IR 10
        lowest = max(lowest, 10 if any(f.overload for f in model.functions) else 8)
    model.ir_version = lowest
    return model


def serialize(model: onnx.ModelProto) -> bytes:
    """The model's bytes with the lowest valid IR version (as ``set_ir_version``), for handing to
    onnxruntime; the caller's proto is left as it was."""
    original = model.ir_version
    try:
        return set_ir_version(model).SerializeToString()
    finally:
        model.ir_version = original


# Temporary files are named ".NAME.rmsnorm-onnx-HOST-PID-RANDOM.tmp" beside the file they become,
# so that one left by a killed run is recognisable, and removable once its process is gone.
TEMP_TAG = "rmsnorm-onnx"
_TEMP_RE = re.compile(rf"^\..*\.{TEMP_TAG}-(?P<host>\w*)-(?P<pid>\d+)-[0-9a-f]{{8}}\.tmp$")
_SPECIAL = {
    stat.S_IFCHR: "character device",
    stat.S_IFBLK: "block device",
    stat.S_IFIFO: "FIFO",
    stat.S_IFSOCK: "socket",
}


def _host() -> str:
    return re.sub(r"\W", "_", socket.gethostname())[:32]


def temp_path(target: Path) -> Path:
    """A fresh name beside ``target`` for a file that will become it (not created here)."""
    base = target.name[:96]  # the whole name must stay under the usual 255-byte limit
    tag = f"{TEMP_TAG}-{_host()}-{os.getpid()}-{secrets.token_hex(4)}"
    return target.parent / f".{base}.{tag}.tmp"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, someone else's
        return True
    return True


def remove_stale_temps(folder: str | os.PathLike[str]) -> list[Path]:
    """Remove our temporary files and folders (a genai folder is built in one) in ``folder``
    whose process (on this host) is gone; returns them. Only regular files and folders (not
    symlinks) of this user, named as ``temp_path`` names them."""
    removed: list[Path] = []
    host, uid = _host(), os.getuid() if hasattr(os, "getuid") else None
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return removed
    for entry in entries:
        match = _TEMP_RE.match(entry.name)
        if not match or match["host"] != host:
            continue
        pid = int(match["pid"])
        if pid == os.getpid() or _alive(pid):
            continue
        try:
            st = entry.stat(follow_symlinks=False)
            if uid is not None and st.st_uid != uid:
                continue
            if stat.S_ISREG(st.st_mode):
                os.unlink(entry.path)
            elif stat.S_ISDIR(st.st_mode):
                shutil.rmtree(entry.path)  # never follows the links inside
            else:
                continue
            removed.append(Path(entry.path))
        except OSError:
            continue
    return removed


def output_target(path: str | os.PathLike[str]) -> Path:
    """The file to write for OUT ``path``: itself, or what it links to when it is a symlink
    (written through, the link kept). Refuses a directory, a device, a FIFO, a socket, a
    dangling symlink and a missing or unwritable folder, each with one clear line."""
    given = Path(path)
    target = given
    if str(os.fspath(path)).endswith((os.sep, "/")):  # Path() drops the slash that says "folder"
        raise UsageError(f"{os.fspath(path)}: names a folder (it ends in '/'), not a file path")
    if len(os.fsencode(given.name)) > _name_max(given.parent):
        raise UsageError(f"{given}: the file name is longer than its folder allows")
    if given.is_symlink():
        target = Path(os.path.realpath(given))
        if not target.exists():
            raise UsageError(
                f"{given}: is a symlink to {target}, which does not exist; refusing to write "
                "through it"
            )
    try:
        st: os.stat_result | None = os.stat(target)
    except FileNotFoundError:
        st = None
    except OSError as e:
        raise UsageError(f"{given}: cannot use it as output ({e.strerror})") from None
    if st is not None and stat.S_ISDIR(st.st_mode):
        raise UsageError(f"{given}: is a directory, not a file path")
    if st is not None and not stat.S_ISREG(st.st_mode):
        kind = _SPECIAL.get(stat.S_IFMT(st.st_mode), "special file")
        raise UsageError(f"{given}: is a {kind}, not a regular file; refusing to replace it")
    folder = target.parent if str(target.parent) else Path(".")
    if not folder.is_dir():
        raise UsageError(f"{given}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"{given}: cannot write in folder {folder} (permission denied)")
    return target


def same_file(a: str | os.PathLike[str], b: str | os.PathLike[str]) -> bool:
    """Whether a and b name one file: the same path after symlinks, or one inode (hard links)."""
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet)
        return os.path.realpath(a) == os.path.realpath(b)


def _name_max(folder: Path) -> int:
    try:
        return os.pathconf(folder, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # no pathconf (Windows), or no such limit
        return 255


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM that arrive in the block take effect after it (main thread only:
    elsewhere Python runs no handler anyway)."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[tuple[int, object]] = []
    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        previous[sig] = signal.signal(sig, lambda num, frame: caught.append((num, frame)))
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        for num, frame in caught[:1]:
            handler = previous[num]
            if callable(handler):
                handler(num, frame)
            elif handler == signal.SIG_DFL:
                signal.raise_signal(num)


@contextlib.contextmanager
def _folder_locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on ``folder`` (flock, where there is one) for the block: two runs
    committing into one folder take turns, so a model and its data files are replaced as a
    pair (two runs writing one OUT would otherwise mix one's graph with the other's weights)."""
    try:
        import fcntl

        fd = os.open(folder, os.O_RDONLY)
    except (ImportError, OSError):  # no flock (Windows), or the folder cannot be opened
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def commit(staged: list[tuple[Path, Path]]) -> None:
    """Move each (temporary, final) pair into place, in order, as one step that Ctrl-C or
    SIGTERM cannot cut in two (they take effect after it) and that another run committing into
    the same folder waits for. The last pair should be the file that names the others (a model
    after its data files)."""
    folders = sorted({final.parent.resolve() for _, final in staged})
    with _signals_deferred(), contextlib.ExitStack() as locks:
        for folder in folders:  # in one order, so that two runs cannot wait on each other
            locks.enter_context(_folder_locked(folder))
        for tmp, final in staged:
            try:
                os.replace(tmp, final)
            except OSError as e:
                raise UsageError(f"{final}: cannot replace it ({e.strerror})") from None


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; move it over ``path`` only if the block succeeds.

    A symlink is written through (see ``output_target``). Stale temporary files of ours in that
    folder, left by killed runs, are removed first.
    """
    target = output_target(path)
    remove_stale_temps(target.parent)
    tmp = new_temp_beside(target)
    try:
        yield tmp
        commit([(tmp, target)])
    finally:
        tmp.unlink(missing_ok=True)


def new_temp_beside(target: Path, *, folder: bool = False) -> Path:
    """A new empty file (or ``folder``) named by ``temp_path`` next to ``target``, made with the
    usual mode: 0666 (0777) less the umask, like any saved file or ``mkdir`` (mkstemp's and
    mkdtemp's private modes would make the result private; reading the umask means setting it,
    which races with other threads)."""
    for _ in range(100):
        tmp = temp_path(target)
        try:
            if folder:
                tmp.mkdir()
            else:
                os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        except OSError as e:
            raise UsageError(f"{target}: cannot write here ({e.strerror})") from None
        return tmp
    what = "folder" if folder else "file"
    raise UsageError(f"{target}: cannot create a temporary {what} in {target.parent}")


def save_model(model: onnx.ModelProto, path: str | os.PathLike[str]) -> Path:
    """Save a model (weights inline, < 2 GB) atomically, with a readable IR version."""
    set_ir_version(model)
    with atomic_path(path) as tmp:
        onnx.save_model(model, tmp)
    return Path(path)


def load_model(path: str | os.PathLike[str], *, load_external_data: bool = True) -> onnx.ModelProto:
    """Load an ONNX file, turning every way it can be unreadable into one clear error."""
    p = Path(path)
    if not p.exists():
        raise InvalidModelError(f"{p}: no such file")
    if p.is_dir():
        raise InvalidModelError(f"{p}: is a directory, not an ONNX file")
    mode = p.stat().st_mode
    if not stat.S_ISREG(mode):  # a FIFO or a device: read to its end it may never end
        kind = _SPECIAL.get(stat.S_IFMT(mode), "special file")
        raise InvalidModelError(f"{p}: is a {kind}, not an ONNX file")
    if p.stat().st_size == 0:
        raise InvalidModelError(f"{p}: empty file, not an ONNX model")
    try:
        # binary, as onnxruntime reads it, whatever the name ends in (onnx would read a model named
        # .json or .txt as text)
        model = onnx.load_model(p, format="protobuf", load_external_data=False)
    except Exception as e:  # protobuf raises DecodeError, RuntimeWarning-ish errors, ValueError
        reason = f"{type(e).__name__}: {e}"
        raise InvalidModelError(f"{p}: not a readable ONNX model ({reason})") from None
    if not model.graph.node and not model.graph.output:
        raise InvalidModelError(f"{p}: parses but holds no graph; not an ONNX model")
    if load_external_data:
        try:
            onnx.external_data_helper.load_external_data_for_model(model, str(p.parent))
        except Exception as e:
            raise InvalidModelError(f"{p}: cannot load its external data ({e})") from None
    return model


# --- external data: references checked as onnxruntime reads them, and where the files may lie

_BYTE_COUNT = re.compile(r"[0-9]+")  # ASCII digits only: int() would take "-256", " 7", "٣"


def external_reference(tensor: onnx.TensorProto, where: str = "model") -> tuple[str, int]:
    """(location, offset + length) of a tensor stored as external data; a malformed reference
    (no location, a NUL in it, an offset or length that is not a byte count) is an
    InvalidModelError naming ``where`` and the tensor."""
    fields = {entry.key: entry.value for entry in tensor.external_data}
    location = fields.get("location", "")
    what = f"{where}: tensor '{tensor.name}'"
    if not location:
        raise InvalidModelError(f"{what} is external but names no data file")
    if "\0" in location:  # onnxruntime would read the file named by the part before it
        raise InvalidModelError(f"{what}: external data location {location!r} holds a NUL byte")
    end = 0
    for key in ("offset", "length"):
        text = fields.get(key, "0")
        if not _BYTE_COUNT.fullmatch(text):
            raise InvalidModelError(
                f"{what}: external data {key} {text!r} is not a byte count (digits only)"
            )
        end += int(text)
    nbytes = _nbytes(tensor)
    if "length" in fields and nbytes is not None and int(fields["length"]) != nbytes:
        raise InvalidModelError(
            f"{what}: external data length {fields['length']} is not the {nbytes} bytes its "
            "type and shape take"
        )
    return location, end


# bits per element of the packed types (those this onnx knows)
_SUB_BYTE = {
    getattr(TensorProto, name): bits
    for name, bits in (("INT4", 4), ("UINT4", 4), ("FLOAT4E2M1", 4), ("INT2", 2), ("UINT2", 2))
    if hasattr(TensorProto, name)
}


def _nbytes(tensor: onnx.TensorProto) -> int | None:
    """The bytes a tensor's data takes by its type and shape; None where that is not fixed (a
    string tensor, an unknown type)."""
    count = math.prod(tensor.dims)
    if tensor.data_type in _SUB_BYTE:
        return -(-count * _SUB_BYTE[tensor.data_type] // 8)
    if tensor.data_type in (TensorProto.STRING, TensorProto.UNDEFINED):
        return None
    try:
        return count * helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, ValueError, TypeError):
        return None


def hf_blobs(folder: str | os.PathLike[str]) -> Path | None:
    """The ``blobs`` folder of the Hugging Face cache ``folder`` lies in, if it lies in one.

    The cache keeps each file once, in ``models--ORG--NAME/blobs/``; a revision is the folder
    ``snapshots/REV/``, whose files are symlinks into those blobs (``../../blobs/HASH``, deeper
    for files in subfolders).
    """
    for path in (os.path.abspath(folder), os.path.realpath(folder)):
        parts = Path(path).parts
        for i in range(len(parts) - 2, 0, -1):
            if parts[i] == "snapshots" and parts[i - 1].startswith("models--"):
                blobs = Path(*parts[:i], "blobs")
                if blobs.is_dir():
                    return Path(os.path.realpath(blobs))
    return None


def inside(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> bool:
    """Whether ``path`` lies inside ``folder`` once every link in both is resolved."""
    return Path(os.path.realpath(folder)) in Path(os.path.realpath(path)).parents


def data_path(location: str, base_dir: Path) -> Path | None:
    """The real path of data file ``location`` of a model in ``base_dir``, or None where it lies
    outside: named by a path inside the folder (no ``..`` out of it, not absolute), and really
    there or in the blobs of the Hugging Face cache the folder is a snapshot of."""
    rel = Path(os.path.normpath(location))
    if rel.is_absolute() or rel.parts[:1] == ("..",):
        return None
    real = Path(os.path.realpath(base_dir / rel))
    if inside(real, base_dir):
        return real
    blobs = hf_blobs(base_dir)
    return real if blobs is not None and inside(real, blobs) else None


def check_external_data(
    model: onnx.ModelProto, base_dir: Path, source: str | os.PathLike[str]
) -> None:
    """Every external data reference is well-formed and its file lies inside ``base_dir`` (see
    ``data_path``), is a regular file and holds the bytes the tensors name."""
    needed: dict[str, int] = {}
    for tensor in all_tensors(model):
        if external_data_helper.uses_external_data(tensor):
            location, end = external_reference(tensor, str(source))
            needed[location] = max(needed.get(location, 0), end)
    for location, end in needed.items():
        path = data_path(location, base_dir)
        if path is None:
            where = os.path.realpath(base_dir)
            raise InvalidModelError(f"{source}: external data '{location}' lies outside {where}")
        if not path.exists():
            raise InvalidModelError(f"{source}: external data file '{location}' is missing")
        if not path.is_file():
            raise InvalidModelError(f"{source}: external data '{location}' is not a regular file")
        size = path.stat().st_size
        if size < end:
            raise InvalidModelError(
                f"{source}: external data file '{location}' is truncated "
                f"({size} bytes, tensors need {end})"
            )
