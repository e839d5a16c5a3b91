"""The streamed weights copied into huge-page memory (bitnet_app/engine/resident.py): the same numbers as the
engine file, the same logits as reading the file's mmap, and nothing the forward does not stream."""
import numpy as np
import pytest

from bitnet_app.engine import resident
from bitnet_app.engine.runtime import Engine
from support import PATHS, ids_for


def test_streamed_names_leave_out_the_embedding_unless_it_is_the_head():
    tied = {"embed": 0, "norm": 0, "head.i8": 0, "head.scale": 0, "layers.0.qkv.codes": 0}
    untied = dict(tied, lm_head=0)
    assert set(resident.streamed_names(tied, "int8")) == {"norm", "head.i8", "head.scale", "layers.0.qkv.codes"}
    assert "embed" in resident.streamed_names(tied, "exact")
    assert set(resident.streamed_names(untied, "int8")) == set(resident.streamed_names(tied, "int8"))
    exact_untied = resident.streamed_names(untied, "exact")
    assert "lm_head" in exact_untied and "embed" not in exact_untied


def test_resident_tensors_hold_the_files_values_in_new_aligned_memory(tiny):
    ef, _ = tiny
    names = resident.streamed_names(ef.tensors, "exact")
    copies = resident.resident_tensors(ef, names)
    assert list(copies) == names
    for name in names:
        c, a = copies[name], ef.tensors[name]
        assert c.dtype == a.dtype and c.shape == a.shape
        np.testing.assert_array_equal(c, a)
        assert not np.shares_memory(c, a)
        assert c.ctypes.data % resident.ALIGN == 0
    assert resident.resident_tensors(ef, []) == {}


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("head", ["int8", "exact"])
def test_resident_and_mapped_weights_give_identical_logits(tiny, isa, head, monkeypatch):
    ef, _ = tiny
    ids = ids_for(ef, 9)
    if not resident.huge_pages_available():
        pytest.fail("this OS has no MADV_HUGEPAGE: the resident copy is never made here")
    out = Engine(ef, lm_head=head, isa=isa, threads=2).forward(ids, rows=range(len(ids)))
    monkeypatch.setenv(resident.WEIGHTS_ENV, "mapped")
    assert not resident.huge_pages_available()
    mapped = Engine(ef, lm_head=head, isa=isa, threads=2).forward(ids, rows=range(len(ids)))
    np.testing.assert_array_equal(out, mapped)


@pytest.mark.parametrize("isa", PATHS)
def test_a_16bit_file_gives_one_set_of_logits_however_its_tiles_are_held(tiny_hd16, isa, monkeypatch):
    """A path that reads the window code (_kernels/trit5_windows.c) gets the file's 1.6-bit tiles translated in
    the resident copy, in a copy of the tiles alone when the weights stay mapped, or when there is no room for the
    resident copy; every way gives the same logits, and the file's own bytes are left as they were."""
    import errno
    from bitnet_app.engine import runtime
    ef, _ = tiny_hd16
    assert ef.packing == "1.6bit"
    before = {n: np.array(t) for n, t in ef.tensors.items() if n.endswith(".codes")}
    ids = ids_for(ef, 9)
    want = Engine(ef, isa=isa, threads=2).forward(ids, rows=range(len(ids)))

    def no_memory(*args):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    with monkeypatch.context() as m:
        m.setattr(runtime, "shared_resident", no_memory)
        np.testing.assert_array_equal(Engine(ef, isa=isa, threads=2).forward(ids, rows=range(len(ids))), want)
    monkeypatch.setenv(resident.WEIGHTS_ENV, "mapped")
    np.testing.assert_array_equal(Engine(ef, isa=isa, threads=2).forward(ids, rows=range(len(ids))), want)
    for name, codes in before.items():
        np.testing.assert_array_equal(ef.tensors[name], codes)


def test_no_room_for_the_copy_falls_back_to_the_files_mmap(tiny, monkeypatch):
    import errno
    from bitnet_app.engine import runtime
    ef, _ = tiny
    ids = ids_for(ef, 5)
    want = Engine(ef, threads=2).forward(ids, rows=range(len(ids)))

    def no_memory(*args):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    monkeypatch.setattr(runtime, "shared_resident", no_memory)
    np.testing.assert_array_equal(Engine(ef, threads=2).forward(ids, rows=range(len(ids))), want)


def test_a_file_cut_short_after_opening_is_an_error_not_a_crash(tiny, tmp_path):
    import shutil
    from bitnet_app.engine.file import EngineFile
    ef, _ = tiny
    path = tmp_path / "m.bitnet"
    shutil.copy(ef.path, path)
    opened = EngineFile(str(path))
    with open(path, "r+b") as f:
        f.truncate(opened.meta["tensors"]["head.i8"]["offset"] + 8)
    with pytest.raises(OSError, match="changed after it was opened"):
        Engine(opened, threads=2)


def test_engines_of_one_file_share_one_resident_copy(tiny, tmp_path):
    import gc
    import shutil
    from bitnet_app.engine.file import EngineFile
    ef, _ = tiny
    a, b = Engine(ef, threads=2), Engine(ef, threads=2)
    name = "layers.0.qkv.codes"
    assert np.shares_memory(a._weights.tensors[name], b._weights.tensors[name])
    assert not np.shares_memory(a._weights.tensors[name], ef.tensors[name])
    assert not np.shares_memory(a._weights.tensors[name], Engine(ef, lm_head="exact", threads=2)._weights.tensors[name])
    path = tmp_path / "copy.bitnet"            # another file with the same bytes: its own copy
    shutil.copy(ef.path, path)
    other = Engine(EngineFile(str(path)), threads=2)
    assert not np.shares_memory(a._weights.tensors[name], other._weights.tensors[name])
    kept = a._weights.tensors[name].copy()
    del a, b, other
    gc.collect()
    c = Engine(ef, threads=2)                  # the copy went with its engines; a new one has the same values
    np.testing.assert_array_equal(c._weights.tensors[name], kept)


def _rss_kb_of_mapping_at(addr: int) -> int:
    """Rss (KB) of the memory mapping of this process that holds address addr (/proc/self/smaps)."""
    with open("/proc/self/smaps") as f:
        inside = False
        for line in f:
            head = line.split()[0] if line.strip() else ""
            if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms offset dev inode path"
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo <= addr < hi
            elif inside and line.startswith("Rss:"):
                return int(line.split()[1])
    raise AssertionError(f"no mapping holds {addr:#x}")


def test_opening_a_file_leaves_none_of_its_checked_pages_in_memory(tiny):
    """The open checks read the whole int8 head and the verified chunks through the file's mapping (the engine then
    reads what it streams into its own copy): those pages leave the process's resident memory, where they counted
    until exit (2B-4T: 1240 MB peak RSS instead of ~900), and a later read of them works as before."""
    from bitnet_app.engine import EngineFile

    ef = EngineFile(tiny[0].path, verify="full")  # a mapping of its own (the fixture's has been read by other tests)
    head = ef.tensors["head.i8"]
    assert head.nbytes >= 16 * 1024  # pages enough that a mapped head would show
    assert _rss_kb_of_mapping_at(head.ctypes.data) == 0
    np.testing.assert_array_equal(head, tiny[0].tensors["head.i8"])  # read again: from the OS's page cache
    assert _rss_kb_of_mapping_at(head.ctypes.data) >= head.nbytes // 4096 * 4  # its whole pages, at least
