"""The command line: bad input is exit 2 with one line and no traceback; nothing starts Ray."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.helpers import REPO, assert_usage_error, harness


def test_help_lists_the_subcommands() -> None:
    proc = harness("--help")
    assert proc.returncode == 0
    for command in ("info", "sweep", "export-onnx"):
        assert command in proc.stdout


def test_info_json() -> None:
    proc = harness("info", "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["versions"]["torch"].startswith("2.") and info["devices"]["auto"] in ("npu", "cuda", "cpu")
    assert info["devices"]["npu"]["available"] is False and "torch_npu" in info["devices"]["npu"]["reason"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "cartpol"], "unknown policy 'cartpol': did you mean 'cartpole'? available: cartpole, huggy-arch"),
        (["--policy", "/nope/model.zip"], "/nope/model.zip: no such file"),
        (["--dtypes", "float8"], "unknown ['float8']"),
        (["--accelerator", "tpu"], "--accelerator 'tpu' is not one of auto, npu, cuda, cpu"),
        (["--accelerator", "npu"], "--accelerator npu asked for, but torch_npu is not importable"),
        (["--inject-fault", "card1:melt"], "--inject-fault 'card1:melt': expected card<N>:<kind>"),
        (["--batch-sizes", "1,x"], "'1,x' is not a comma-separated list of int"),
        (["--cards", "0"], "--cards 0: need at least 1"),
        (["--config", "/nope.toml"], "/nope.toml: no such config file"),
    ],
)
def test_bad_sweep_input_is_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    assert_usage_error(harness("sweep", *args, "--results", str(tmp_path)), expected)
    assert not (tmp_path / "runs").exists(), "nothing written for a refused sweep"


def test_bad_policy_files_are_exit_2_naming_the_file(tmp_path: Path) -> None:
    not_zip = tmp_path / "policy.zip"
    not_zip.write_text("hello")
    assert_usage_error(harness("sweep", "--policy", str(not_zip)), f"{not_zip}:")
    no_pth = tmp_path / "empty.zip"
    with zipfile.ZipFile(no_pth, "w") as z:
        z.writestr("data", "{}")
    assert_usage_error(harness("sweep", "--policy", str(no_pth)), f"{no_pth}:")
    bad_onnx = tmp_path / "bad.onnx"
    bad_onnx.write_bytes(b"\x08\x07garbage")
    assert_usage_error(harness("export-onnx", str(bad_onnx), str(tmp_path / "out.onnx")), f"{bad_onnx}:")


def test_config_file_is_read_and_flags_win(tmp_path: Path) -> None:
    from harness.cli import build_parser
    from harness.config import config_from_args

    toml = tmp_path / "sweep.toml"
    toml.write_text('policies = ["cartpole"]\ndtypes = ["float16"]\nepisodes = 7\n')
    config = config_from_args(build_parser().parse_args(["sweep", "--config", str(toml), "--episodes", "3"]))
    assert (config.policies, config.dtypes, config.episodes) == (["cartpole"], ["float16"], 3)
    toml.write_text("colour = 'blue'\n")
    assert_usage_error(harness("sweep", "--config", str(toml)), "unknown keys colour")


def test_export_onnx_command(tmp_path: Path) -> None:
    out = tmp_path / "cartpole.onnx"
    proc = harness("export-onnx", "cartpole", str(out))
    assert proc.returncode == 0 and out.stat().st_size > 1000


def test_cluster_yaml_is_valid_for_the_local_provider() -> None:
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local" and "available_node_types" not in config
    validate_config(prepare_config(config))  # what `ray up cluster.yaml` does first
    assert all('--resources=\'{"NPU"' in cmd for cmd in config["head_start_ray_commands"][1:] + config["worker_start_ray_commands"][1:])


def test_onnx_with_wrong_shapes_is_exit_2(cases: Path, tmp_path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(cases / "mlagents-3DBall" / "3DBall.onnx")
    gemm_weights = {n.input[1] for n in model.graph.node if n.op_type == "Gemm"}
    init = next(i for i in model.graph.initializer if i.name in gemm_weights)
    wrong = numpy_helper.to_array(init)[:, :-3].copy()  # three inputs short
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(wrong), init.name))
    bad = tmp_path / "wrong-shapes.onnx"
    onnx.save(model, bad)
    assert_usage_error(harness("sweep", "--policy", str(bad), "--results", str(tmp_path)), f"{bad}:")


def test_unknown_flag_is_one_line_exit_2() -> None:
    proc = harness("sweep", "--bogus")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == ["harness: error: unrecognized arguments: --bogus (see harness --help)"]
