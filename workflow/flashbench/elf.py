"""Read one named constant out of a cubin: a 64-bit little-endian ELF file, as nvcc writes them."""
from __future__ import annotations

import struct
from pathlib import Path

from . import FlashbenchError

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section index, value, size
SHT_SYMTAB, SHT_NOBITS = 2, 8


def symbol_bytes(path: Path | str, name: str) -> bytes:
    """The initial value of the data symbol `name`. A cubin's symbol values are offsets into their
    own section (each section is loaded on its own)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise FlashbenchError(f"{path}: not a 64-bit little-endian ELF file")
    header = _HEADER.unpack_from(data)
    section_offset, section_size, sections_count = header[6], header[11], header[12]
    sections = [_SECTION.unpack_from(data, section_offset + i * section_size) for i in range(sections_count)]
    for symtab in (s for s in sections if s[1] == SHT_SYMTAB):
        strtab_offset = sections[symtab[6]][4]
        for i in range(symtab[5] // _SYMBOL.size):
            name_at, _, _, index, value, size = _SYMBOL.unpack_from(data, symtab[4] + i * _SYMBOL.size)
            start = strtab_offset + name_at
            if data[start:data.index(b"\0", start)].decode() != name:
                continue
            if not 0 < index < len(sections) or sections[index][1] == SHT_NOBITS:
                raise FlashbenchError(f"{path}: {name} has no initial value in the file")
            at = sections[index][4] + value
            return data[at:at + size]
    raise FlashbenchError(f"{path}: no symbol {name}")
