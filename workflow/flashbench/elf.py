"""Read one named constant out of a cubin: a 64-bit little-endian ELF file, as nvcc writes them."""
from __future__ import annotations

import struct
from pathlib import Path

from . import FlashbenchError

_HEADER = struct.Struct("<16sHHIQQQIHHHHHH")  # Elf64_Ehdr
_SECTION = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr: name, type, flags, addr, offset, size, link, info, align, entsize
_SYMBOL = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, section index, value, size
SHT_SYMTAB, SHT_NOBITS = 2, 8


class NoSuchSymbol(FlashbenchError):
    """The file is a readable ELF file without the symbol asked for."""


def symbol_bytes(path: Path | str, name: str) -> bytes:
    """The initial value of the data symbol `name`: its bytes in the file, found at its section's
    file offset plus its address within the section (a cubin's sections all start at address 0)."""
    data = Path(path).read_bytes()
    if data[:4] != b"\x7fELF" or data[4:6] != b"\x02\x01":
        raise FlashbenchError(f"{path}: not a 64-bit little-endian ELF file")
    try:
        header = _HEADER.unpack_from(data)
        section_offset, section_size, sections_count = header[6], header[11], header[12]
        sections = [_SECTION.unpack_from(data, section_offset + i * section_size) for i in range(sections_count)]
        wanted = name.encode() + b"\0"
        for symtab in (s for s in sections if s[1] == SHT_SYMTAB):
            strtab_offset = sections[symtab[6]][4]
            for i in range(symtab[5] // _SYMBOL.size):
                name_at, _, _, index, value, size = _SYMBOL.unpack_from(data, symtab[4] + i * _SYMBOL.size)
                if data[strtab_offset + name_at:strtab_offset + name_at + len(wanted)] != wanted:
                    continue
                if not 0 < index < len(sections) or sections[index][1] == SHT_NOBITS:
                    raise FlashbenchError(f"{path}: {name} has no initial value in the file")
                _, _, _, address, offset, section_bytes, *_ = sections[index]
                at = offset + value - address
                if not (value >= address and value - address + size <= section_bytes):
                    raise FlashbenchError(f"{path}: {name} lies outside its section")
                return data[at:at + size]
    except (struct.error, IndexError) as e:
        raise FlashbenchError(f"{path}: a damaged ELF file ({e})") from None
    raise NoSuchSymbol(f"{path}: no symbol {name}")
