"""Exceptions users see. The CLI prints them as one line; exit 1 for failures, 2 for usage."""

from __future__ import annotations


class RMSNormOnnxError(Exception):
    """Base class: a failure explained in one line, shown without a traceback by the CLI."""

    exit_code = 1


class InvalidModelError(RMSNormOnnxError):
    """An ONNX file that cannot be read, is corrupt, or is not a valid model."""


class UsageError(RMSNormOnnxError):
    """The user asked for something that cannot be done as asked (bad option, bad path)."""

    exit_code = 2
