"""Counts the reliability tests report (fuzz cases, hostile files) in pytest's terminal summary.

``record(config, "fuzz cases, target custom", 400)`` from a fixture or test; the first call
registers a small plugin whose ``pytest_terminal_summary`` prints every count in a section of
its own, so the numbers show in CI's output without ``-s`` and without a conftest hook.
"""

from __future__ import annotations

import pytest

_NAME = "rmsnorm_onnx-reliability-counts"


class _Counts:
    def __init__(self) -> None:
        self.lines: dict[str, str] = {}

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.lines:
            return
        terminalreporter.section("reliability counts")
        for label, value in self.lines.items():
            terminalreporter.write_line(f"{label}: {value}")


def record(config: pytest.Config, label: str, value: object) -> None:
    """Show ``label: value`` in the terminal summary (a later value for a label replaces it)."""
    plugin = config.pluginmanager.get_plugin(_NAME)
    if plugin is None:
        plugin = _Counts()
        config.pluginmanager.register(plugin, _NAME)
    plugin.lines[label] = str(value)
