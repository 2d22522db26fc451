"""The onnxruntime session the pass's own checks run a model in (``verify``, ``headroom``): CPU,
the model given as bytes, its external data read from the input's folder.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import onnx

from .. import onnx_io, op_schema

_EXTERNAL_FOLDER = "session.model_external_initializers_file_folder_path"


def _data_folder(model: onnx.ModelProto, base_dir: Path) -> tuple[onnx.ModelProto, Path]:
    """The model with each external data location made relative to one folder that holds every
    data file's real path, and that folder.

    onnxruntime refuses, for a model given as bytes, data files whose real path lies outside the
    folder it is told, such as a Hugging Face cache snapshot's links into the cache's blobs (it
    reads them when given the file's path).
    """
    real = {}
    for tensor in onnx_io.all_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                real[entry.value] = os.path.realpath(base_dir / entry.value)
    folder = os.path.realpath(base_dir)
    if all(os.path.dirname(path) == folder for path in real.values()):
        return model, Path(folder)
    folder = os.path.commonpath([folder, *real.values()])
    moved = onnx.ModelProto()
    moved.CopyFrom(model)  # the caller's model is left as it was (its weights are references)
    for tensor in onnx_io.all_tensors(moved):
        for entry in tensor.external_data:
            if entry.key == "location":
                entry.value = os.path.relpath(real[entry.value], folder)
    return moved, Path(folder)


def cpu_session(model: onnx.ModelProto, base_dir: Path | None, *, library: bool = True) -> Any:
    """An ORT session on the model's bytes; external data is read from ``base_dir`` by ORT. Our
    library is registered where the model imports our domain, unless ``library`` is False."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 4  # its errors are raised, in one line
    if base_dir is not None:
        model, folder = _data_folder(model, base_dir)
        options.add_session_config_entry(_EXTERNAL_FOLDER, str(folder))
    data = onnx_io.serialize(model)  # the caller's model (fuse's input) is left as it was
    if library and any(o.domain == op_schema.DOMAIN for o in model.opset_import):
        from ..runtime import session

        return session(data, options=options)
    return ort.InferenceSession(data, sess_options=options, providers=["CPUExecutionProvider"])
