"""TEMPORARY shim while fusion/__init__.py still imports the old name (removed at the end)."""

from .inline_weights import WeightsInFile as Split
from .inline_weights import read

__all__ = ["Split", "read"]
