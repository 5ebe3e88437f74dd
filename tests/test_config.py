import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
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
    ("dma_bandwidth_bytes_per_cycle", -1.0, "dma_bandwidth_bytes_per_cycle = -1.0: expected a finite number in"),
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


@pytest.mark.parametrize("field,value", [
    ("clock_hz", "fast"), ("clock_hz", None), ("clock_hz", [1e9]), ("clock_hz", True), ("clock_hz", {"hz": 1}),
    ("dma_bandwidth_bytes_per_cycle", "16"), ("array_rows", "16"), ("array_rows", None), ("array_rows", True),
    ("array_rows", [16]), ("dtypes", None), ("dtypes", 8), ("dtypes", [["fp32"]]), ("dataflow", None),
    ("dataflow", ["weight_stationary"]),
])
def test_a_value_of_the_wrong_type_is_a_config_error_naming_the_field(field, value):
    with pytest.raises(ConfigError, match=f"^HardwareConfig.{field} = "):
        HardwareConfig(**{field: value})


def test_arrays_and_tracers_pass_through_continuous_fields():
    hw = HardwareConfig(clock_hz=np.float32(2e9), dma_bandwidth_bytes_per_cycle=np.array([8.0, 16.0]))
    assert isinstance(hw.clock_hz, np.float32) and hw.dma_bandwidth_bytes_per_cycle.shape == (2,)
    assert jax.jit(lambda c: HardwareConfig(clock_hz=c).clock_hz * 2)(1e9) == 2e9
    assert HardwareConfig(array_rows=np.int64(32), scratchpad_banks=4.0).array_rows == 32
    with pytest.raises(ConfigError, match=re.escape("clock_hz = array([1.e+09, 0.e+00]): expected finite numbers in")):
        HardwareConfig(clock_hz=np.array([1e9, 0.0]))
    with pytest.raises(ConfigError, match="HardwareConfig.clock_hz = array"):
        HardwareConfig(clock_hz=np.array(["1e9"]))


@pytest.mark.parametrize("name, content, message", [
    ("missing.yaml", None, "missing.yaml: cannot read the hardware config (No such file or directory)"),
    ("latin1.yaml", "array_rows: 8 # größe\n".encode("latin-1"), "latin1.yaml: cannot read the hardware config "
                                                                  "('utf-8' codec can't decode byte 0xf6"),
    ("list.yaml", "- array_rows\n- 8\n", "list.yaml: a hardware config must be a mapping of field names, got list"),
    ("empty.yaml", "", "empty.yaml: a hardware config must be a mapping of field names, got NoneType"),
    ("nested.yaml", "array_rows: {a: 1}\n", "nested.yaml: HardwareConfig.array_rows = {'a': 1}: expected an integer"),
    ("tagged.yaml", "array_rows: !!python/object:os.system ls\n", "tagged.yaml: could not determine a constructor"),
    ("numbers.json", '{"clock_hz": "fast"}', "numbers.json: HardwareConfig.clock_hz = 'fast': expected a finite"),
    ("broken.json", '{"clock_hz": ', "broken.json: Expecting value"),
])
def test_config_file_problems_are_config_errors_naming_the_path(tmp_path, name, content, message):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content if isinstance(content, bytes) else content.encode())
    with pytest.raises(ConfigError) as e:
        HardwareConfig.load(path)
    assert str(e.value).startswith(f"{path}: ") and message in str(e.value)


def test_a_folder_is_not_a_config(tmp_path):
    with pytest.raises(ConfigError, match=f"{tmp_path}: cannot read the hardware config"):
        HardwareConfig.load(tmp_path)
