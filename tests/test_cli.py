"""The command line: one options system for sweep and bench (flags, TOML, help with defaults);
bad input is exit 2 with one line and no traceback, before Ray starts and with nothing written."""

from __future__ import annotations

import importlib
import json
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from harness.config.options import BenchConfig, SweepConfig, config_from_args
from tests.helpers import REPO, assert_usage_error, cli, harness


def _npu_present() -> bool:
    from harness.devices import accelerator

    return accelerator("npu").detect().available


def test_the_real_command_lists_its_subcommands_and_reports_a_mistake_in_one_line() -> None:
    proc = harness("--help")
    assert proc.returncode == 0
    for command in ("info", "sweep", "bench", "query", "report", "export-onnx"):
        assert command in proc.stdout
    bad = harness("sweep", "--bogus")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.strip().splitlines() == ["harness: error: unrecognized arguments: --bogus (see harness --help)"]


def test_a_subcommand_that_fails_to_import_fails_the_command_line(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.cli

    monkeypatch.setitem(sys.modules, "harness.cli.report", None)  # `import harness.cli.report` now raises
    monkeypatch.delattr(harness.cli, "report")
    with pytest.raises(ImportError, match=r"harness\.cli\.report"):
        importlib.reload(harness.cli)
    monkeypatch.undo()
    importlib.reload(harness.cli)


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_help_shows_every_default(command: str) -> None:
    text = " ".join(cli(command, "--help").stdout.split())
    assert "--policy NAME_OR_PATH" in text and "(default: cartpole huggy-arch)" in text
    assert "(default: auto)" in text and "(default: results)" in text and "(default: 0; 0 to 4294967295)" in text
    if command == "sweep":
        assert "(default: float32,float16,bfloat16)" in text and "(default: 1,8,4096)" in text and "(default: 4)" in text
    else:
        assert "(default: float32)" in text and "(default: 1,8,256,4096)" in text and "(default: 0.15)" in text
        assert "(default: 12)" in text and "95% interval" in text  # a % in help is text, not a format


def test_info_json() -> None:
    proc = cli("info", "--json")
    assert proc.returncode == 0
    info = json.loads(proc.stdout)
    assert info["versions"]["torch"].startswith("2.") and info["devices"]["auto"] in ("npu", "cuda", "cpu")
    npu = info["devices"]["npu"]
    assert npu["available"] == _npu_present()
    if not npu["available"]:
        assert "torch_npu" in npu["reason"]


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--policy", "cartpol"], "unknown policy 'cartpol': did you mean 'cartpole'? available: cartpole, huggy-arch"),
        (["--policy", "/nope/model.zip"], "/nope/model.zip: no such file"),
        (["--dtypes", "float8"], "--dtypes 'float8' is not one of float32, float16, bfloat16"),
        (["--accelerator", "tpu"], "--accelerator 'tpu' is not one of auto, npu, cuda, cpu"),
        (["--inject-fault", "card1:melt"], "--inject-fault 'card1:melt': expected card<N>:<kind>"),
        (["--batch-sizes", "1,x"], "'1,x' is not a comma-separated list of int"),
        (["--cards", "0"], "--cards 0: must be at least 1"),
        (["--cards", "two"], "--cards 'two' is not an int"),
        (["--config", "/nope.toml"], "/nope.toml: no such file"),
        (["--precision", "fast"], "--precision 'fast' is not one of strict, device-default"),
        (["--episode-batching", "wide"], "--episode-batching 'wide' is not one of lockstep, single"),
        (["--tolerance", "float16=0.1"], "--tolerance 'float16=0.1': expected DTYPE=ATOL,RTOL"),
        (["--tolerance", "float8=0.1,0.1"], "DTYPE one of float32, float16, bfloat16, float32-tf32"),
        (["--ratio-limits", "5,3,10"], "--ratio-limits '5.0,3.0,10.0': three limits"),
        # inf passes a lower bound and nan passes `at least`: every number must also be finite
        (["--return-margin", "1e999"], "--return-margin '1e999': '1e999': the margin must be a finite number"),
        (["--return-margin", "1e999std"], "the margin must be a finite number"),
        (["--auto-max-seconds", "inf"], "--auto-max-seconds inf: must be a finite number"),
        (["--hang-timeout", "1e999"], "--hang-timeout inf: must be a finite number"),
        (["--ratio-limits", "3,5,nan"], "--ratio-limits '3.0,5.0,nan': nan: must be a finite number"),
        (["--max-memory", "nan"], "--max-memory nan: must be a finite number"),
        (["--action-kind", "maybe"], "--action-kind 'maybe' is not one of discrete, continuous"),
        (["--inject-fault", "everything:reduced-fp32"], "expected card<N>:<kind> or all:<kind>"),
        (
            ["--policy", "huggy-arch", "--env", "CartPole-v1"],
            "environment CartPole-v1 does not fit policy huggy-arch: its observations flatten to 4 values, the policy "
            "takes 59",
        ),
        (
            ["--policy", "huggy-arch", "--env", "CartPol-v1"],
            "environment 'CartPol-v1' is not registered in gymnasium; did you mean CartPole-v1",
        ),
        # cartpole names its own environment, so --env is not played: a misspelt one is still refused
        (["--policy", "cartpole", "--env", "CartPole-v9"], "--env CartPole-v9: environment 'CartPole-v9' is not registered"),
        # faults that could never strike: a negative test that passes with them proves nothing
        (
            ["--inject-fault", "card5:corrupt-weight", "--cards", "2"],
            "--inject-fault card5:corrupt-weight: the run has 2 card(s) (--cards 2): card0 to card1",
        ),
        (
            ["--inject-fault", "card2:corrupt-weight", "--accelerator", "cpu"],
            "the run has 2 card(s) (the private local Ray's simulated cards; --cards N for more)",
        ),
        (["--inject-fault", "card0:fp16-accumulate", "--dtypes", "float32"], "it acts only on float16, and the run computes"),
        (["--inject-fault", "all:reduced-fp32", "--dtypes", "float16,bfloat16"], "it acts only on float32"),
        (
            ["--inject-fault", "card0:ignore-masks"],
            "--inject-fault card0:ignore-masks: no policy of the run takes action masks",
        ),
    ],
)
def test_bad_sweep_input_is_exit_2(args: list[str], expected: str, tmp_path: Path) -> None:
    import ray

    assert_usage_error(cli("sweep", *args, "--results", str(tmp_path)), expected)
    assert not (tmp_path / "runs").exists(), "nothing written for a refused sweep"
    assert not ray.is_initialized(), "refused before Ray starts"


def test_npu_asked_for_where_there_is_none_is_exit_2(tmp_path: Path) -> None:
    if _npu_present():
        pytest.skip("this machine has an NPU")
    assert_usage_error(
        cli("sweep", "--accelerator", "npu", "--results", str(tmp_path)),
        "--accelerator npu asked for, but torch_npu is not importable",
    )


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch-sizes", "0"], "--batch-sizes"),
        (["--env-impl", "gym"], "--env-impl 'gym' is not one of auto, numpy, gymnasium"),
        (["--card-counts", "two"], "comma-separated list of int"),
        (["--card-counts", "1,4", "--cards", "2"], "more than --cards 2"),
        (["--duration", "-1"], "--duration"),
        (["--duration", "soon"], "--duration 'soon' is not a float"),
        (["--duration", "inf"], "--duration inf: must be a finite number"),
        (["--window", "1e999"], "--window inf: must be a finite number"),
        (["--max-spread", "nan"], "--max-spread nan: must be a finite number"),
        (["--windows", "0"], "--windows 0: must be at least 1"),
        (["--latency-bound-ms", "0"], "--latency-bound-ms 0.0: must be more than 0"),
        (["--inject-fault", "card0:crash-once"], "a bench injects only into its timed path"),
        (["--inject-fault", "card0:slow"], "expected card<N>:<kind> or all:<kind>"),
        (["--policy", "cartpol"], "did you mean 'cartpole'"),
        (["--inject-fault", "card3:perturb-weight", "--cards", "2"], "the run has 2 card(s) (--cards 2)"),
        (["--inject-fault", "card0:fp16-accumulate"], "it acts only on float16"),
        (["--inject-fault", "all:ignore-masks"], "no policy of the run takes action masks (cartpole, huggy-arch)"),
    ],
)
def test_bad_bench_input_is_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    assert_usage_error(cli("bench", "--accelerator", "cpu", "--results", str(tmp_path), *args), message)
    assert not (tmp_path / "bench").exists()


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_results_that_is_a_file_is_exit_2_before_ray_starts(command: str, tmp_path: Path) -> None:
    import ray

    not_a_folder = tmp_path / "results"
    not_a_folder.write_text("a file")
    assert_usage_error(
        cli(command, "--accelerator", "cpu", "--results", str(not_a_folder)), f"--results {not_a_folder}: is a file"
    )
    assert not ray.is_initialized()
    assert not_a_folder.read_text() == "a file"


def test_bad_policy_files_are_exit_2_naming_the_file(tmp_path: Path) -> None:
    not_zip = tmp_path / "policy.zip"
    not_zip.write_text("hello")
    assert_usage_error(cli("sweep", "--policy", str(not_zip)), f"{not_zip}:")
    no_pth = tmp_path / "empty.zip"
    with zipfile.ZipFile(no_pth, "w") as z:
        z.writestr("data", "{}")
    assert_usage_error(cli("sweep", "--policy", str(no_pth)), f"{no_pth}:")
    bad_onnx = tmp_path / "bad.onnx"
    bad_onnx.write_bytes(b"\x08\x07garbage")
    assert_usage_error(cli("export-onnx", str(bad_onnx), str(tmp_path / "out.onnx")), f"{bad_onnx}:")


def _parse(*args: str):
    from harness.cli import build_parser

    return build_parser().parse_args(list(args))


def test_config_file_is_read_by_both_commands_and_flags_win(tmp_path: Path) -> None:
    toml = tmp_path / "run.toml"
    toml.write_text('policies = ["cartpole"]\ndtypes = ["float16"]\nbatch_sizes = "1,64"\nthreads = 2\n')
    sweep = config_from_args(_parse("sweep", "--config", str(toml), "--threads", "3"), SweepConfig)
    assert (sweep.policies, sweep.dtypes, sweep.batch_sizes, sweep.threads, sweep.episodes) == (
        ["cartpole"],
        ["float16"],
        [1, 64],
        3,
        4,
    )
    toml.write_text(toml.read_text() + "duration = 1\ncard_counts = [1, 2]\n")
    bench = config_from_args(_parse("bench", "--config", str(toml)), BenchConfig)
    assert (bench.policies, bench.dtypes, bench.duration, bench.card_counts) == (["cartpole"], ["float16"], 1.0, [1, 2])
    # A sweep-only key is unknown to bench, and the other way round.
    toml.write_text("episodes = 7\n")
    assert_usage_error(cli("bench", "--config", str(toml)), "unknown keys episodes")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("colour = 'blue'\n", "unknown keys colour"),
        ("episodes = 'many'\n", "episodes 'many': expected a count of episodes (0 or more) or auto"),
        ("policies = 'cartpole'\n", "policies must be a list of str"),
        ("progress = 1\n", "progress must be a bool"),
        ("episodes = \n", "not valid TOML"),
        ("hang_timeout = inf\n", "--hang-timeout inf: must be a finite number"),  # TOML has inf and nan
        ("auto_max_seconds = nan\n", "--auto-max-seconds nan: must be a finite number"),
        ('policies = ["cartpole"]\n[envs]\ncartpole = "CartPole-v9"\n', "[envs] cartpole CartPole-v9: environment"),
    ],
)
def test_bad_config_file_is_exit_2(tmp_path: Path, text: str, expected: str) -> None:
    toml = tmp_path / "sweep.toml"
    toml.write_text(text)
    assert_usage_error(cli("sweep", "--config", str(toml), "--results", str(tmp_path)), expected)


def test_the_config_maps_policies_to_environments(tmp_path: Path) -> None:
    toml = tmp_path / "sweep.toml"
    toml.write_text(
        'policies = ["cartpole", "huggy-arch"]\nrequire_batch_invariance = true\n[envs]\ncartpole = "CartPole-v1"\n'
    )
    config = config_from_args(_parse("sweep", "--config", str(toml)), SweepConfig)
    assert config.envs == {"cartpole": "CartPole-v1"} and config.require_batch_invariance
    from harness.config.command_plan import sweep_plan
    from harness.sweeps.plan import policy_specs

    spec = next(s for s in policy_specs(sweep_plan(config).common) if s.source == "cartpole")
    assert (spec.env_id, spec.env_overrides) == ("CartPole-v1", True)
    from harness.policies import PolicySpec, load_policy

    assert load_policy(spec).info.env_id == "CartPole-v1", "a policy's own entry in envs wins over its files"
    assert load_policy(PolicySpec("cartpole", env_id="CartPole-v1", env_source="--env")).info.env_id == "seals/CartPole-v0", (
        "--env only fills in"
    )
    toml.write_text('policies = ["cartpole"]\n[envs]\n"model.zip" = "CartPole-v1"\n')
    assert_usage_error(
        cli("sweep", "--config", str(toml), "--results", str(tmp_path)), "envs names model.zip, not among the policies"
    )
    toml.write_text('envs = "CartPole-v1"\n')
    assert_usage_error(cli("sweep", "--config", str(toml), "--results", str(tmp_path)), "envs must be a table of strings")


def test_defaults_live_in_one_place() -> None:
    from harness.dtypes import CARD_DTYPES
    from harness.config.options import DEFAULT_POLICIES

    assert SweepConfig().policies == BenchConfig().policies == list(DEFAULT_POLICIES)
    assert SweepConfig().dtypes == list(CARD_DTYPES) and BenchConfig().dtypes == ["float32"]


def test_export_onnx_command(tmp_path: Path) -> None:
    out = tmp_path / "cartpole.onnx"
    proc = cli("export-onnx", "cartpole", str(out))
    assert proc.returncode == 0 and out.stat().st_size > 1000


def test_cluster_yaml_is_valid_for_the_local_provider() -> None:
    from harness.cluster.ray_internals import validate_cluster_config

    config = yaml.safe_load((REPO / "cluster.yaml").read_text())
    assert config["provider"]["type"] == "local" and "available_node_types" not in config
    validate_cluster_config(config)  # what `ray up cluster.yaml` does first
    assert all(
        '--resources=\'{"NPU"' in cmd
        for cmd in config["head_start_ray_commands"][1:] + config["worker_start_ray_commands"][1:]
    )


def test_onnx_with_wrong_shapes_is_exit_2(mlagents_export: Path, tmp_path: Path) -> None:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(mlagents_export)
    gemm_weights = {n.input[1] for n in model.graph.node if n.op_type == "Gemm"}
    init = next(i for i in model.graph.initializer if i.name in gemm_weights)
    wrong = numpy_helper.to_array(init)[:, :-3].copy()  # three inputs short
    init.CopyFrom(numpy_helper.from_array(np.ascontiguousarray(wrong), init.name))
    bad = tmp_path / "wrong-shapes.onnx"
    onnx.save(model, bad)
    assert_usage_error(cli("sweep", "--policy", str(bad), "--results", str(tmp_path)), f"{bad}:")


def test_info_lists_each_card_and_the_settings_it_starts_with(monkeypatch: pytest.MonkeyPatch) -> None:
    import harness.devices

    npu = {
        "available": True,
        "reason": "",
        "simulated": False,
        "devices": ["Ascend910B3", "Ascend910B3"],
        "runtime": {"cann": "8.1.RC1"},
        "settings": {"torch_npu.npu.is_jit_compile_false()": True},
        "warnings": ["torch 2.13.0 and torch-npu 2.6.0.post5 are not the same X.Y"],
    }
    local = {
        "npu": npu,
        "cuda": {"available": False, "reason": "no CUDA", "simulated": False, "devices": [], "warnings": []},
        "cpu": {"available": True, "reason": "", "simulated": True, "devices": ["x"], "cores": 2, "warnings": []},
        "auto": "npu",
    }
    monkeypatch.setattr(harness.devices, "describe_local", lambda: local)
    out = cli("info").stdout
    assert "npu                available: 2 card(s): Ascend910B3, Ascend910B3" in out
    assert "cann = 8.1.RC1" in out and "torch_npu.npu.is_jit_compile_false() = True" in out and "auto picks         npu" in out
    assert "warning: torch 2.13.0 and torch-npu 2.6.0.post5 are not the same X.Y" in out
    assert "cuda               no: no CUDA" in out and "cpu                simulated cards on x (2 cores)" in out


def test_each_option_s_choices_and_bounds_are_declared_once_and_hold_for_flags_and_toml(tmp_path: Path) -> None:
    """The flag, the TOML key and --help all read a field's choices and bounds from its metadata."""
    from harness.config.fields import fields

    checked = 0
    for config_type, command in ((SweepConfig, "sweep"), (BenchConfig, "bench")):
        help_text = " ".join(cli(command, "--help").stdout.split())
        for name, (_, meta) in fields(config_type).items():
            allowed = meta.allowed()
            if allowed is None or meta.kind != "value":
                continue
            assert all(choice in help_text for choice in allowed), (meta.flag, allowed)
            config = tmp_path / f"{command}-{name}.toml"
            config.write_text(f'{name} = "no-such-choice"\n')
            proc = cli(command, "--config", str(config), "--results", str(tmp_path / "r"))
            assert_usage_error(proc, f"{meta.flag} 'no-such-choice' is not one of {', '.join(allowed)}")
            checked += 1
        config = tmp_path / f"{command}-threads.toml"
        config.write_text("threads = 0\n")
        assert_usage_error(cli(command, "--config", str(config)), "--threads 0: must be at least 1")
    assert checked >= 6


@pytest.mark.parametrize("args", [["--error-factor", "inf"], ["--drop-percent", "nan"], ["--error-factor", "1e999"]])
def test_report_s_numbers_are_finite_as_every_option_s(args: list[str], tmp_path: Path) -> None:
    proc = cli("report", "--compare", "a", "b", *args, "--results", str(tmp_path))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith(f"harness report: error: argument {args[0]}: ") and "must be a finite number" in line, line
