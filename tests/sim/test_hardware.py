"""Hardware catalog, name lookup, YAML/JSON loading."""

import json
from pathlib import Path

import pytest

from accel.errors import SimError
from accel.sim import Deployment, Hardware, hardware, list_hardware, load_hardware

REFERENCE_DEVICES = [
    "cloud-ai-100-standard",
    "cloud-ai-100-pro",
    "cloud-ai-100-ultra",
    "a100-40gb",
    "a100-80gb",
    "h100-sxm",
    "h100-pcie",
    "h200",
    "l4",
    "l40s",
    "mi300x",
    "tpu-v4",
]


def test_catalog_covers_reference_and_cites_sources():
    assert set(REFERENCE_DEVICES) <= set(list_hardware())
    for name in list_hardware():
        hw = hardware(name)
        assert hw.source and ("docs/reference.md" in hw.source or "docs/sim.md" in hw.source)
        assert hw.notes and "assumed" in hw.notes.lower() and "accel/sim/catalog.py" in hw.notes


def test_ultra_is_four_socs_of_the_card_totals():
    hw = hardware("cloud-ai-100-ultra")
    assert hw.num_devices == 4
    assert hw.num_devices * hw.memory_bandwidth_bytes_per_s == pytest.approx(548e9)
    assert hw.total_memory_capacity_bytes == pytest.approx(128e9)
    assert hw.num_devices * hw.peak_flops("fp16") == pytest.approx(290e12)
    assert hw.bandwidth_efficiency == 0.7  # read off Qualcomm's published FP16 decode rates (accel/sim/published.py)
    assert hw.decompress_rate("mxfp6") == 7.5e10 and hw.decompress_overlap  # per SoC, beside the weight stream
    assert hw.decompress_rate("fp16") is None


@pytest.mark.parametrize(
    "alias,name",
    [
        ("Cloud AI 100 Ultra", "cloud-ai-100-ultra"),
        ("A100-80GB", "a100-80gb"),
        ("nvidia_h100_sxm", "h100-sxm"),
        ("AMD MI300X", "mi300x"),
        ("TPU v4", "tpu-v4"),
        ("ai100-pro", "cloud-ai-100-pro"),
    ],
)
def test_name_lookup(alias, name):
    assert hardware(alias).name == name


def test_unknown_lists_names():
    with pytest.raises(SimError, match=r"known: .*cloud-ai-100-ultra"):
        hardware("a100-81gb")


def test_load_yaml_and_json(tmp_path):
    y = tmp_path / "dev.yaml"
    y.write_text("base: cloud-ai-100-ultra\nbandwidth_efficiency: 0.45\ncall_overhead_s: 0.001\n")
    hw = load_hardware(y)
    assert hw.bandwidth_efficiency == 0.45 and hw.num_devices == 4 and hw.name == "cloud-ai-100-ultra"
    j = tmp_path / "x.json"
    j.write_text(
        json.dumps(
            {"memory_bandwidth_bytes_per_s": 1e11, "memory_capacity_bytes": 8e9, "peak_flops_per_s": {"fp16": 1e13}}
        )
    )
    assert load_hardware(j).name == "x"
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {"memory_bandwidth_bytes_per_s": -1, "memory_capacity_bytes": 8e9, "peak_flops_per_s": {"fp16": 1e13}}
        )
    )
    with pytest.raises(SimError, match="memory_bandwidth_bytes_per_s"):
        load_hardware(bad)
    typo = tmp_path / "typo.yaml"
    typo.write_text("base: l4\nbandwith: 3\n")
    with pytest.raises(SimError, match="unknown fields"):
        load_hardware(typo)
    with pytest.raises(SimError, match="efficiency"):
        Hardware(
            name="x",
            memory_bandwidth_bytes_per_s=1e9,
            memory_capacity_bytes=1e9,
            peak_flops_per_s={"fp16": 1e12},
            bandwidth_efficiency=1.5,
        )


def test_hardware_from_a_mapping():
    hw = load_hardware({"base": "a100-80gb", "bandwidth_efficiency": 0.5})
    assert hw.bandwidth_efficiency == 0.5 and hw.memory_capacity_bytes == hardware("a100-80gb").memory_capacity_bytes
    dep = Deployment(target="llama-2-7b", hardware={"base": "a100-80gb", "bandwidth_efficiency": 0.5})
    assert dep.hardware == hw
    assert Deployment(target="llama-2-7b", hardware=hardware("l4").model_dump(mode="json")).hardware == hardware("l4")
    with pytest.raises(SimError, match="unknown fields"):
        load_hardware({"base": "l4", "bandwith": 3})
    with pytest.raises(SimError, match="base must be a catalog name"):
        load_hardware({"base": 4})
    with pytest.raises(SimError, match="path or a mapping"):
        load_hardware(3.5)  # type: ignore[arg-type]


def test_strict_types_in_hardware_files(tmp_path):
    """Booleans from YAML/JSON booleans only; numbers not from strings; decompression rates per compressed format."""
    y = tmp_path / "d.yaml"
    y.write_text("base: l4\ndecompress_overlap: 'false'\n")
    with pytest.raises(SimError, match="decompress_overlap"):
        load_hardware(y)
    y.write_text("base: l4\nbandwidth_efficiency: '0.5'\n")
    with pytest.raises(SimError, match="bandwidth_efficiency"):
        load_hardware(y)
    y.write_text("base: l4\nnum_devices: true\n")
    with pytest.raises(SimError, match="num_devices"):
        load_hardware(y)
    y.write_text(
        "base: l4\ndecompress_elements_per_s: {mxfp6: 2.0e+11, int4-g32: 1.0e+12}\ndecompress_overlap: false\n"
    )
    hw = load_hardware(y)
    assert hw.decompress_rate("mxfp6") == 2e11 and hw.decompress_rate("int4-g64") == 1e12  # int4 groups share a rate
    with pytest.raises(SimError, match="computed as stored"):
        hardware("l4").with_(decompress_elements_per_s={"bf16": 1e12})
    with pytest.raises(SimError, match="finite"):
        hardware("l4").with_(decompress_elements_per_s={"mxfp4": float("inf")})


def test_fixed_cost_and_link_terms_are_fields():
    hw = hardware("a100-80gb")
    assert hw.layer_overhead_s > 0 and hw.allreduce_latency_s > 0 and hw.link_latency_s > 0
    assert not hw.decompress_overlap and hw.decompress_rate("int4") and hw.decompress_rate("int8")
    with pytest.raises(SimError, match="layer_overhead_s"):
        hw.with_(layer_overhead_s=-1.0)


NEW_DEVICES = {  # name: (GB/s, GB, dense fp16/bf16 TFLOPS, family) from the datasheets docs/sim.md §6 cites
    "b200": (7700, 180, 2250, "gpu-nvlink"),
    "gb200": (8000, 186, 2500, "gpu-nvlink"),
    "mi325x": (6000, 256, 1307.4, "gpu-nvlink"),
    "mi355x": (8000, 288, 2516.6, "gpu-nvlink"),
    "tpu-v5e": (819, 16, 197, "tpu-ici"),
    "tpu-v6e": (1638, 32, 918, "tpu-ici"),
    "gaudi3": (3670, 128, 1835, "gaudi-roce"),
}


@pytest.mark.parametrize("name", NEW_DEVICES)
def test_newer_devices_carry_datasheet_figures_a_source_and_family_defaults(name):
    from accel.sim.catalog import FAMILY_DEFAULTS

    gbs, gb, tflops, family = NEW_DEVICES[name]
    hw = hardware(name)
    assert hw.memory_bandwidth_bytes_per_s == gbs * 1e9 and hw.memory_capacity_bytes == gb * 1e9
    assert hw.peak_flops("fp16") == pytest.approx(tflops * 1e12) and hw.peak_flops("bf16") == hw.peak_flops("fp16")
    assert hw.family == family and hw.source
    for term, value in FAMILY_DEFAULTS[family].items():
        assert getattr(hw, term) == value
    doc = (Path(__file__).resolve().parents[2] / "docs" / "sim.md").read_text()
    assert f"`{name}`" in doc  # its row, with the datasheet it comes from


def test_families_price_fixed_costs_and_links_differently():
    """A TPU's step (one compiled program, ICI all-reduces) carries less fixed cost per layer and per all-reduce than
    an NVLink GPU's; a PCIe card keeps NVLink's latencies (no published point) over its PCIe link bandwidth."""
    tpu, nv, pcie = hardware("tpu-v6e"), hardware("h100-sxm"), hardware("l40s")
    assert tpu.layer_overhead_s < nv.layer_overhead_s and tpu.allreduce_latency_s < nv.allreduce_latency_s
    assert pcie.family == "gpu-pcie" and pcie.link_bandwidth_bytes_per_s < nv.link_bandwidth_bytes_per_s
    assert hardware("cloud-ai-100-ultra").family == "cloud-ai-100" and hardware("tpu-v4").family == "tpu-ici"
    assert hardware("Trillium").name == "tpu-v6e" and hardware("Gaudi 3").name == "gaudi3"
