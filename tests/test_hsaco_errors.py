"""Bad code objects: one clear CodeObjectError naming the file, exit 2 from the CLI, never a traceback."""

import struct
import subprocess
import sys

import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from compile_helpers import compile_one
from isa_tools import CodeObjectError, read_code_object


@pytest.fixture(scope="module")
def hsaco(tmp_path_factory):
    import os

    os.environ["TRITON_CACHE_DIR"] = str(tmp_path_factory.mktemp("triton-cache"))
    spec = {"kernel": "fa_like_kernel", "arch": "gfx942",
            "constexprs": {"BLOCK_M": 64, "BLOCK_N": 32, "HEAD_DIM": 64},
            "options": {"num_warps": 4, "num_stages": 1}}
    return compile_one(spec)["hsaco"]


def _note_desc_span(data: bytes) -> tuple[int, int]:
    """Byte span of the metadata note's msgpack payload, found through pyelftools."""
    import io

    from elftools.elf.elffile import ELFFile

    elf = ELFFile(io.BytesIO(data))
    for section in elf.iter_sections():
        if section["sh_type"] == "SHT_NOTE":
            for note in section.iter_notes():
                if note["n_name"] == "AMDGPU":
                    start = note["n_descdata_offset"] if "n_descdata_offset" in note else None
                    if start is None:
                        start = data.index(note["n_desc"])
                    return start, start + note["n_descsz"]
    raise AssertionError("no note")


def _bad_objects(good: bytes) -> dict:
    import io

    from elftools.elf.elffile import ELFFile

    start, end = _note_desc_span(good)
    corrupt_msgpack = good[:start] + b"\xc1" * (end - start) + good[end:]
    string_payload = msgpack.packb("x" * (end - start - 3))  # str16: 3 header bytes, same size as the map
    assert len(string_payload) == end - start
    not_a_map = good[:start] + string_payload + good[end:]
    elf = ELFFile(io.BytesIO(good))
    note_header = elf.get_section_by_name(".note").header
    # Turn the note section into plain PROGBITS: an AMD ELF that no longer has a metadata note.
    shoff = elf.header["e_shoff"] + elf.get_section_index(".note") * elf.header["e_shentsize"]
    no_note = bytearray(good)
    struct.pack_into("<I", no_note, shoff + 4, 1)  # sh_type = SHT_PROGBITS
    assert note_header["sh_type"] == "SHT_NOTE"
    kd_name = b"fa_like_kernel.kd\x00"
    no_kd = good.replace(kd_name, b"fa_like_kernel.kx\x00")
    assert no_kd != good
    return {
        "truncated": (good[: len(good) // 2], "malformed or truncated"),
        "corrupt msgpack": (corrupt_msgpack, "corrupt metadata note"),
        "metadata not a map": (not_a_map, "not a map"),
        "no metadata note": (bytes(no_note), "no AMDGPU metadata note"),
        "no kernel descriptor": (no_kd, "no kernel descriptor symbol"),
    }


def test_each_bad_object_gets_its_own_message(hsaco, tmp_path):
    assert read_code_object(hsaco)  # the untouched object reads
    for label, (data, expected) in _bad_objects(hsaco).items():
        path = tmp_path / (label.replace(" ", "_") + ".hsaco")
        path.write_bytes(data)
        with pytest.raises(CodeObjectError) as info:
            read_code_object(str(path))
        message = str(info.value)
        assert str(path) in message and expected in message, (label, message)
        assert "\n" not in message


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "rocmflash.cli", "isa", *args],
                          capture_output=True, text=True, timeout=120)


def test_cli_bad_inputs_one_line_exit_2(hsaco, tmp_path):
    cases = {"missing": (tmp_path / "nope.hsaco", "no such file")}
    empty = tmp_path / "empty.hsaco"
    empty.write_bytes(b"")
    cases["empty"] = (empty, "empty file")
    text = tmp_path / "text.hsaco"
    text.write_text("hello")
    cases["not elf"] = (text, "not an ELF file")
    cases["x86-64 elf"] = (sys.executable, "not an AMD GPU code object")
    for label, (data, expected) in _bad_objects(hsaco).items():
        path = tmp_path / (label.replace(" ", "_") + ".hsaco")
        path.write_bytes(data)
        cases[label] = (path, expected)
    before = sorted(p.name for p in tmp_path.iterdir())
    for label, (path, expected) in cases.items():
        result = _cli(str(path), "--json")
        assert result.returncode == 2, (label, result.stderr)
        assert result.stdout == "", label
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, (label, result.stderr)
        assert str(path) in lines[0] and expected in lines[0], (label, lines[0])
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # nothing written


def test_a_damaged_note_header_is_a_code_object_error(hsaco):
    """Hypothesis found it in CI: byte 512 set to 1 breaks the note section so that pyelftools' parser raises
    its own ``construct`` error (ArrayError), which the reader let through as a traceback."""
    blob = bytearray(hsaco)
    blob[512] = 1
    with pytest.raises(CodeObjectError, match="malformed"):
        read_code_object(bytes(blob), path="mutated.hsaco")


def test_empty_directory_is_an_error(tmp_path):
    result = _cli(str(tmp_path))
    assert result.returncode == 2 and "no .hsaco" in result.stderr


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_mutated_objects_raise_only_code_object_error(hsaco, data):
    blob = bytearray(hsaco)
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        pos = data.draw(st.integers(0, len(blob) - 1), label="pos")
        blob[pos] = data.draw(st.integers(0, 255), label="byte")
    cut = data.draw(st.one_of(st.none(), st.integers(0, len(blob))), label="truncate")
    mutated = bytes(blob if cut is None else blob[:cut])
    try:
        kernels = read_code_object(mutated, path="mutated.hsaco")
    except CodeObjectError as err:
        assert "\n" not in str(err)
        return
    for kernel in kernels:  # a mutation the reader accepts must still give well-typed records
        assert isinstance(kernel.vgpr_count, int) and isinstance(kernel.name, str)
