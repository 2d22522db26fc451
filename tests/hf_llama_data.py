"""Writes tests/data/hf-llama.{fp32,fp16}.fused.onnx and tests/data/hf-llama.npz: a tiny
Hugging Face Llama (one decoder layer, test_torch_export_models' config) exported fused, with
token ids and torch's logits for them, so that runtimes without torch (OpenVINO's venv) can run a
real fused export. Regenerate after a change to what fused exports hold, with the main venv:

    PYTHONPATH=. .venv/bin/python tests/hf_llama_data.py

Node metadata (torch's provenance, about half of each file) is left out to keep the files small.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from test_torch_export_models import build, example, forward_kwargs, run_torch

from rmsnorm_onnx import export, onnx_io

DATA = Path(__file__).resolve().parent / "data"
NAME = "llama"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16}
BATCH, SEQ = 3, 11  # other sizes than the export's example (2, 6): the dims stay dynamic


def main() -> int:
    DATA.mkdir(exist_ok=True)
    arrays: dict[str, np.ndarray] = {}
    for dtype_name, dtype in DTYPES.items():
        model = build(NAME, dtype)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            args = (example(NAME, 2, 6, dtype),)
            proto = export(model, args, kwargs=forward_kwargs(NAME), rmsnorm="fused")
        for node in proto.graph.node:
            del node.metadata_props[:]
        path = DATA / f"hf-llama.{dtype_name}.fused.onnx"
        onnx_io.save_model(proto, path)
        ids = example(NAME, BATCH, SEQ, dtype)
        arrays[f"{dtype_name}_input_ids"] = ids.numpy()
        arrays[f"{dtype_name}_logits"] = run_torch(model, NAME, ids)
        print(f"{path}  {path.stat().st_size / 1024:.1f} KiB")
    np.savez_compressed(DATA / "hf-llama.npz", **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
