"""Occupancy and waves against numbers worked out by hand from the CUDA occupancy rules."""

import pytest

from speedlight import hardware
from speedlight.inspect.occupancy import Waves, occupancy

SM90 = hardware.arch_limits((9, 0))
SM80 = hardware.arch_limits(80)


@pytest.mark.parametrize("warps,regs,smem,blocks,limiter", [
    # 32 regs x 32 lanes = 1024 per warp: 16 warps per sub-partition, 64 per SM = 8 x 8 warps
    pytest.param(8, 32, 32, 8, "warps", id="full-sm"),
    # 101 regs -> 3232 -> 3328 per warp (units of 256): 4 per sub-partition, 16 per SM
    pytest.param(8, 101, 8192, 2, "registers", id="101-regs"),
    # 255 regs -> 8192 per warp: 2 per sub-partition, 8 warps per SM
    pytest.param(1, 255, 0, 8, "registers", id="255-regs"),
    # 100 KB + 1 KB reserve -> 103424 bytes per block: 2 fit in 228 KB
    pytest.param(4, 32, 100 * 1024, 2, "shared memory", id="smem-bound"),
    # tiny programs: the 32-blocks-per-SM limit binds before 64 warps
    pytest.param(1, 16, 0, 32, "blocks", id="block-limit"),
    pytest.param(4, 256, 0, 0, "registers", id="over-255-regs"),
    pytest.param(4, 32, 228 * 1024, 0, "shared memory", id="over-smem-per-block"),
])
def test_sm90_occupancy(warps, regs, smem, blocks, limiter):
    occ = occupancy(SM90, warps, regs, smem)
    assert occ.blocks_per_sm == blocks
    assert occ.limiter == limiter
    assert occ.fraction == pytest.approx(blocks * warps / 64)


def test_sm80_has_less_shared_memory_than_sm90():
    smem = 60 * 1024
    assert occupancy(SM80, 4, 32, smem).blocks_per_sm == 2  # 164 KB // 62.5 KB
    assert occupancy(SM90, 4, 32, smem).blocks_per_sm == 3  # 228 KB // 62.5 KB


def test_arch_limits_cover_the_targets_and_cite_sources():
    for cc in ((8, 0), (9, 0), (10, 0)):
        limits = hardware.arch_limits(cc)
        assert limits.max_warps_per_sm == 64 and limits.regs_per_sm == 65536
        assert limits.sources["limits"] and limits.sources["allocation"]
    assert hardware.arch_limits(89).max_warps_per_sm == 48
    with pytest.raises(KeyError, match="no SM limits"):
        hardware.arch_limits((7, 5))


def test_waves_and_last_wave_idle_share():
    w = Waves(programs=140, sms=132, per_sm=1)
    assert w.per_wave == 132 and w.full_waves == 1
    assert w.waves == pytest.approx(140 / 132)
    assert w.idle_share == pytest.approx(1 - 8 / 132)
    whole = Waves(programs=264, sms=132, per_sm=2)
    assert whole.waves == 1.0 and whole.idle_share == 0.0
    few = Waves(programs=8, sms=132, per_sm=4)
    assert few.busy_sms == 8 and few.resident_per_sm == pytest.approx(8 / 132)
