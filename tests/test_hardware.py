"""Hardware presets load, every number has a source, and bad hardware files are clear errors."""
import dataclasses

import pytest

from hbmsim.scenarios.experiment import HARDWARE_DIR, preset_names
from hbmsim.simulator import GPU, HbmsimError, load_gpu


@pytest.mark.parametrize("name", preset_names())
def test_preset_every_number_has_a_source(name):
    gpu = load_gpu(HARDWARE_DIR / f"{name}.toml")
    assert gpu.name == name
    for f in dataclasses.fields(GPU):
        if f.name not in ("name", "source"):
            assert len(gpu.source.get(f.name, "")) > 20, f"{name}: no source for {f.name}"


def test_presets_listed():
    assert {"a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h200-sxm-141gb"} <= set(preset_names())


def test_a100_spec_sheet_numbers(a100):
    assert (a100.sm_count, a100.clock_hz, a100.hbm_bytes_per_s) == (108, 1.41e9, 1.555e12)
    assert a100.matmul_flops_per_s == 312e12 and a100.l2_bytes == 40 * 1024 * 1024


def write(tmp_path, text):
    p = tmp_path / "hw.toml"
    p.write_text(text)
    return p


BASE = open(HARDWARE_DIR / "a100-sxm4-40gb.toml").read().split("\n[source]")[0]


@pytest.mark.parametrize("edit, message", [
    (lambda s: s.replace("sm_count = 108", "sm_count = -1"), r"field 'sm_count' = -1 must be > 0"),
    (lambda s: s.replace("sm_count = 108", ""), r"missing hardware field 'sm_count'"),
    (lambda s: s + "\nwarp_size = 32\n", r"unknown hardware field 'warp_size'"),
    (lambda s: s.replace("sm_count = 108", "sm_count = 10.5"), r"field 'sm_count' = 10.5 must be a whole number"),
    (lambda s: s.replace("sm_count = 108", 'sm_count = "many"'), r"field 'sm_count' = 'many' must be a finite number"),
    (lambda s: s.replace("l2_sector_request_bytes = 32", "l2_sector_request_bytes = 16"),
     r"field 'l2_sector_request_bytes' = 16 must be at least 32 \(a request moves a whole 32-byte sector\)"),
    (lambda s: s.replace("l2_dirty_fraction = 0.0", "l2_dirty_fraction = 1.5"),
     r"field 'l2_dirty_fraction' = 1.5 must be at most 1 \(a fraction of the L2's bytes\)"),
    (lambda s: s.replace("l2_dirty_fraction = 0.0", "l2_dirty_fraction = -0.5"),
     r"field 'l2_dirty_fraction' = -0.5 must be >= 0 \(0: not given\)"),
])
def test_bad_hardware_file(tmp_path, edit, message):
    assert "sm_count = 108" in BASE
    with pytest.raises(HbmsimError, match=message):
        load_gpu(write(tmp_path, edit(BASE)))
