"""Generators of ONNX files written by non-torch exporters, each with a sidecar JSON that says
how many RMSNorm layers one forward of the source model calls (see ``common.Entry``).

Run in an exporter venv, from the repository root:

    PYTHONPATH=tests python -m exporters OUT_DIR [--tools keras_tf,jax_flax,...]
"""
