import dataclasses
import json

import jax
import jax.numpy as jnp
import pytest

from stagec.isa import ConfigError, HardwareConfig


def test_defaults_are_an_edge_accelerator():
    hw = HardwareConfig()
    assert (hw.array_rows, hw.array_cols, hw.dataflow) == (16, 16, "weight_stationary")
    assert hw.scratchpad_bytes == 256 * 1024 and hw.accumulator_bytes == 64 * 1024
    assert hw.vector_lanes == 16 and hw.dma_bandwidth_bytes_per_cycle == 16.0 and hw.clock_hz == 1e9
    assert set(hw.dtypes) == {"int8", "bf16", "fp32"}


@pytest.mark.parametrize("field,value,fragment", [
    ("array_rows", 0, "array_rows = 0: expected an integer in [1, 1024]"),
    ("scratchpad_bytes", 2.5, "scratchpad_bytes = 2.5: expected an integer"),
    ("dma_bandwidth_bytes_per_cycle", -1.0, "dma_bandwidth_bytes_per_cycle = -1.0: expected a number in"),
    ("clock_hz", float("nan"), "clock_hz = nan"),
    ("dataflow", "row_stationary", "expected one of ('weight_stationary', 'output_stationary')"),
    ("dtypes", ("int4",), "expected a non-empty set of distinct modes"),
])
def test_bad_values_name_the_field_and_range(field, value, fragment):
    with pytest.raises(ConfigError) as e:
        HardwareConfig(**{field: value})
    assert fragment in str(e.value)


def test_memory_must_split_into_banks():
    with pytest.raises(ConfigError, match="multiple of scratchpad_banks"):
        HardwareConfig(scratchpad_bytes=1000, scratchpad_banks=3)


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_file_round_trip(tmp_path, suffix):
    hw = HardwareConfig(array_rows=32, scratchpad_bytes=384 * 1024, dataflow="output_stationary",
                        dtypes=("fp32", "int8"), energy_pj_per_dram_byte=40.0)
    path = tmp_path / f"hw{suffix}"
    hw.save(path)
    assert HardwareConfig.load(path) == hw


def test_unknown_and_duplicate_keys_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unknown hardware config field 'array_row'; did you mean 'array_rows'"):
        HardwareConfig.from_dict({"array_row": 8})
    yml = tmp_path / "dup.yaml"
    yml.write_text("array_rows: 8\narray_rows: 16\n")
    with pytest.raises(ConfigError, match="duplicate hardware config key 'array_rows'"):
        HardwareConfig.load(yml)
    js = tmp_path / "dup.json"
    js.write_text('{"array_cols": 8, "array_cols": 4}')
    with pytest.raises(ConfigError, match="duplicate hardware config key 'array_cols'"):
        HardwareConfig.load(js)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"vector_lanes": 0}))
    with pytest.raises(ConfigError, match=r"bad.json: HardwareConfig.vector_lanes = 0"):
        HardwareConfig.load(bad)


def test_pytree_leaves_are_the_continuous_fields():
    hw = HardwareConfig(array_rows=8)
    leaves, treedef = jax.tree_util.tree_flatten(hw)
    continuous = [f.name for f in dataclasses.fields(HardwareConfig) if not f.metadata["static"]]
    assert "dma_bandwidth_bytes_per_cycle" in continuous and "array_rows" not in continuous
    assert len(leaves) == len(continuous) and all(isinstance(v, float) for v in leaves)
    assert jax.tree_util.tree_unflatten(treedef, leaves) == hw

    def dram_time(cfg):   # a toy cost: bytes / bandwidth, in seconds
        return 1e6 / cfg.dma_bandwidth_bytes_per_cycle / cfg.clock_hz

    g = jax.grad(dram_time)(hw)
    assert g.array_rows == 8   # static fields ride along untouched
    assert g.dma_bandwidth_bytes_per_cycle == pytest.approx(-1e6 / 16.0**2 / 1e9)
    batch = jax.tree_util.tree_map(lambda v: jnp.array([v, 2 * v]), hw)
    times = jax.vmap(dram_time)(batch)
    assert times.shape == (2,) and float(times[0]) == pytest.approx(4 * float(times[1]))
