"""tools/fatbin_prune.py on a real CUDA library that nvcc builds here for sm_80 and sm_90 (cubins
and sm_90 PTX): pruning to sm_90 zeroes exactly sm_80's code, keeps every other byte, and still
parses; a library without the asked-for architecture is refused and nothing is written."""

from __future__ import annotations

from pathlib import Path

import nvcc_library
import pytest
import tool_modules

fatbin_prune = tool_modules.load("fatbin_prune")


@pytest.fixture(scope="module")
def library(tmp_path_factory) -> Path:
    return nvcc_library.build(tmp_path_factory.mktemp("fatbin"))


def test_lists_each_architecture_and_kind(library):
    found = {(e.arch, e.kind) for e in fatbin_prune.entries(library.read_bytes())}
    assert found == {(80, 2), (90, 2), (90, 1)}


def test_prune_zeroes_only_other_architectures(library, tmp_path):
    before = library.read_bytes()
    out = tmp_path / "k90.so"
    assert fatbin_prune.main([str(library), str(out), "--keep", "90"]) == 0
    after = out.read_bytes()
    assert len(after) == len(before)
    entries = fatbin_prune.entries(after)  # headers intact: it still parses, to the same entries
    assert entries == fatbin_prune.entries(before)
    changed = {i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b}
    pruned = set()
    for e in entries:
        payload = after[e.start : e.start + e.size]
        if e.arch == 80:
            assert payload == bytes(e.size)
            pruned.update(range(e.start, e.start + e.size))
        else:
            assert payload == before[e.start : e.start + e.size]
    assert changed and changed <= pruned  # nothing outside sm_80's payloads moved


def test_refuses_an_architecture_the_library_lacks(library, tmp_path):
    out = tmp_path / "k75.so"
    with pytest.raises(ValueError, match=r"no sm_75 cubin .*\[80, 90\]"):
        fatbin_prune.main([str(library), str(out), "--keep", "75"])
    assert not out.exists() and not out.with_name("k75.so.tmp").exists()


def test_refuses_a_file_that_is_not_elf(tmp_path):
    with pytest.raises(ValueError, match="not a 64-bit ELF"):
        fatbin_prune.entries(b"PK\x03\x04" + bytes(100))
