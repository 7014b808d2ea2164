"""Reading nvdisasm listings: widths, the instruction mix and per-line attribution."""

from speedlight.inspect import sass

LISTING = """
\t//## File "/src/k.py", line 10
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
        /*0020*/              @P0 LDG.E.U16 R6, desc[UR4][R2.64+0x2] ;
        /*0030*/              @!P1 LDG.E.64.CONSTANT R8, desc[UR4][R2.64] ;
\t//## File "/src/k.py", line 12
        /*0040*/                   STG.E.64 desc[UR4][R2.64], R4 ;
        /*0050*/                   MUFU.EX2 R1, R2 ;
        /*0060*/                   HGMMA.64x64x16.F32 R24, gdesc[UR4], RZ, !UPT ;
        /*0070*/                   BAR.SYNC.DEFER_BLOCKING 0x0 ;
        /*0080*/                   STL [R1], R2 ;
        /*0090*/                   LDL R3, [R1] ;
        /*00a0*/              @!UP0 UTMALDG.2D [UR8], [UR4] ;
        /*00b0*/                   LDS.128 R12, [R3] ;
        /*00c0*/                   SHFL.BFLY PT, R9, R8, 0x10, 0x1f ;
        /*00d0*/                   STG.E desc[UR4][R2.64], R4 ;
"""


def test_widths_of_global_accesses():
    instrs = sass.parse(LISTING)
    assert [i.width for i in instrs if i.base == "LDG"] == [128, 16, 64]
    m = sass.mix(instrs)
    assert dict(m.global_loads) == {128: 1, 16: 1, 64: 1}
    assert dict(m.global_stores) == {64: 1, 32: 1}
    assert m.wide_addresses == 5  # every LDG/STG above uses .E (64-bit addresses)


def test_instruction_mix_counts_each_family():
    m = sass.mix(sass.parse(LISTING))
    assert m.total == 13
    assert dict(m.tensor_core) == {"HGMMA": 1}
    assert dict(m.tma) == {"UTMALDG": 1}
    assert dict(m.local) == {"STL": 1, "LDL": 1}
    assert dict(m.mufu) == {"EX2": 1}
    assert m.shared["LDS"] == 1 and m.barriers == 1 and m.shuffles == 1


def test_accesses_are_attributed_to_their_source_line():
    by_line = sass.accesses_by_line(sass.parse(LISTING))
    loads = by_line[("/src/k.py", 10, "load")]
    assert loads.narrowest == 16 and loads.widest == 128
    stores = by_line[("/src/k.py", 12, "store")]
    assert dict(stores.widths) == {64: 1, 32: 1}
    assert stores.describe() == "STG.64 x1, STG.32 x1"


# an inlined helper's load as each Triton's nvdisasm prints it: 3.6's names the helper's line
# `inlined at` the caller; 3.9's adds the caller's line after it
INLINED = """
\t//## File "/src/common.py", line 143 inlined at "/src/bwd.py", line 61
        /*0010*/                   LDG.E.128 R4, desc[UR4][R2.64] ;
\t//## File "/src/common.py", line 143 inlined at "/src/bwd.py", line 59
\t//## File "/src/bwd.py", line 59
        /*0020*/                   LDG.E.128 R8, desc[UR4][R2.64] ;
\t//## File "/src/bwd.py", line 63
        /*0030*/                   STG.E.128 desc[UR4][R2.64], R4 ;
"""


def test_an_inlined_access_is_attributed_to_the_helper_line_on_either_nvdisasm():
    by_line = sass.accesses_by_line(sass.parse(INLINED))
    assert dict(by_line[("/src/common.py", 143, "load")].widths) == {128: 2}
    assert ("/src/bwd.py", 59, "load") not in by_line
    assert dict(by_line[("/src/bwd.py", 63, "store")].widths) == {128: 1}
