"""Zero the GPU code a machine will never load, so a CUDA library compresses small enough to carry.

onnxruntime-gpu's CUDA provider library is 271 MiB, 205 MiB of it the ``.nv_fatbin`` section: one
container per compilation unit, each holding a cubin per architecture (sm_75, 80, 86, 89, 90, 120
in 1.31.1, each zstd-compressed already). A GPU loads only the cubin of its own architecture, so
the others can be zeroed in place: the file keeps its size, layout and every header (the driver
still reads each container's entry list), and the zeros compress to nothing. For sm_90 the
library then packs to about 50 MiB instead of 221 (tools/gpu_carry.sh), one device call's carry.

The layout read here (little-endian): a container is a 16-byte header (magic 0xBA55ED50, u16
version, u16 header size, u64 size of its entries), then entries, each a header (u16 kind, u16
version, u32 header size, u64 padded payload size, ..., u32 architecture at byte 28) followed by
its payload. Containers are 8-byte aligned; padding between them is skipped.

    python3 tools/fatbin_prune.py IN.so OUT.so --keep 90     # prune
    python3 tools/fatbin_prune.py IN.so --list               # architectures and their bytes
"""

from __future__ import annotations

import argparse
import struct
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

MAGIC = 0xBA55ED50
CONTAINER = struct.Struct("<IHHQ")
ENTRY = struct.Struct("<HHIQ")
ARCH_AT = 28  # the entry header's u32 architecture (90 for sm_90)


@dataclass(frozen=True)
class Entry:
    arch: int
    kind: int  # 1: PTX, 2: cubin (ELF)
    start: int  # the payload's offset in the file
    size: int


def section(data: bytes | bytearray, name: str) -> tuple[int, int]:
    """(offset, size) of an ELF64 section by name."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        raise ValueError("not a 64-bit ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)

    def header(i: int) -> tuple[int, ...]:
        return struct.unpack_from("<IIQQQQ", data, shoff + i * shentsize)

    names = header(shstrndx)[4]
    for i in range(shnum):
        name_at, _, _, _, offset, size = header(i)
        start = names + name_at
        if data[start : data.index(0, start)].decode() == name:
            return offset, size
    raise ValueError(f"no {name} section")


def entries(data: bytes | bytearray) -> list[Entry]:
    """Every entry of every container in the .nv_fatbin section."""
    offset, size = section(data, ".nv_fatbin")
    pos, end, found = offset, offset + size, []
    while pos + CONTAINER.size <= end:
        magic, _, header_size, body = CONTAINER.unpack_from(data, pos)
        if magic != MAGIC:
            pos += 8  # alignment padding between containers
            continue
        e, stop = pos + header_size, pos + header_size + body
        if stop > end:
            raise ValueError(f"a fatbin container at {pos:#x} runs past its section")
        while e < stop:
            kind, _, entry_header, payload = ENTRY.unpack_from(data, e)
            arch = struct.unpack_from("<I", data, e + ARCH_AT)[0]
            if entry_header < ARCH_AT + 4 or e + entry_header + payload > stop:
                raise ValueError(f"a malformed fatbin entry at {e:#x}")
            found.append(Entry(arch, kind, e + entry_header, payload))
            e += entry_header + payload
        pos = stop
    return found


def prune(data: bytearray, keep: int) -> int:
    """Zero every payload not for architecture ``keep``; the bytes zeroed. Refuses a file with no
    cubin for ``keep`` (it would load nothing on that GPU)."""
    found = entries(data)
    if not any(e.arch == keep and e.kind == 2 for e in found):
        archs = sorted({e.arch for e in found})
        raise ValueError(f"no sm_{keep} cubin in this file (it has {archs})")
    zeroed = 0
    for e in found:
        if e.arch != keep:
            data[e.start : e.start + e.size] = bytes(e.size)
            zeroed += e.size
    return zeroed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("input", type=Path)
    p.add_argument("output", type=Path, nargs="?")
    p.add_argument("--keep", type=int, help="the architecture to keep, e.g. 90 for sm_90")
    p.add_argument("--list", action="store_true", help="bytes per architecture, then stop")
    args = p.parse_args(argv)
    data = bytearray(args.input.read_bytes())
    if args.list:
        sizes = Counter()
        for e in entries(data):
            sizes[(e.arch, "cubin" if e.kind == 2 else "ptx")] += e.size
        for (arch, kind), size in sorted(sizes.items()):
            print(f"sm_{arch} {kind}: {size / 2**20:.1f} MiB")
        return 0
    if args.output is None or args.keep is None:
        p.error("give OUTPUT and --keep, or --list")
    zeroed = prune(data, args.keep)
    tmp = args.output.with_name(args.output.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(args.output)
    print(f"{args.output}: zeroed {zeroed / 2**20:.1f} MiB of other architectures' code")
    return 0


if __name__ == "__main__":
    sys.exit(main())
