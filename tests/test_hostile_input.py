"""Hostile and careless input: no run id, results path or config reaches a file outside the
results, and every bomb is exit 2 with one line, before Ray starts."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from harness.api import sweep
from harness.errors import UsageError
from harness.store.paths import check_run_id, inside
from harness.store.schema import CheckRow
from harness.store.claim import Claim
from harness.store.writer import RunWriter, to_table
from tests.helpers import assert_usage_error, cli, harness, run_row

BASE = ("--policy", "cartpole", "--dtypes", "float32", "--accelerator", "cpu", "--no-progress")
QUICK = (*BASE, "--episodes", "0")  # a sweep's


def _quick(command: str) -> tuple[str, ...]:
    return QUICK if command == "sweep" else BASE


def _victim(path: Path) -> Path:
    """A folder with a file in it that no run may touch."""
    path.mkdir(parents=True)
    (path / "precious.txt").write_text("keep me")
    return path


def _untouched(path: Path) -> bool:
    return (path / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize("run_id", ["{victim}", "..", "../../victim", "a/b", ".hidden", "x" * 129, "", "semi;colon", "a b"])
def test_a_run_id_that_is_not_a_name_is_exit_2_and_touches_nothing(tmp_path: Path, run_id: str) -> None:
    victim = _victim(tmp_path / "victim")
    results = tmp_path / "space" / "results"
    run_id = run_id.format(victim=victim)
    for command in ("sweep", "bench"):
        proc = cli(command, *_quick(command), "--results", str(results), "--run-id", run_id)
        assert_usage_error(proc, "a run id is a name of letters, digits")
    assert _untouched(victim) and not results.exists()


def test_run_ids_are_checked_wherever_they_are_taken(tmp_path: Path) -> None:
    victim = _victim(tmp_path / "victim")
    results = tmp_path / "results"
    results.mkdir()
    assert_usage_error(cli("sweep", *QUICK, "--results", str(results), "--resume", "../victim"), "--resume '../victim'")
    assert_usage_error(cli("report", "../victim", "--results", str(results)), "RUN_ID '../victim'")
    assert_usage_error(cli("report", "--compare", "a", "/etc", "--results", str(results)), "--compare '/etc'")
    config = tmp_path / "sweep.toml"
    config.write_text(f'run_id = "{victim}"\n')
    assert_usage_error(cli("sweep", *QUICK, "--results", str(results), "--config", str(config)), "--run-id")
    job = subprocess.run(
        ["python", "jobs/sweep.py", *QUICK, "--results", str(results), "--run-id", ".."],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
        env={**os.environ, "PATH": f"{Path(os.sys.executable).parent}:{os.environ['PATH']}"},
    )
    assert job.returncode == 2 and "Traceback" not in job.stderr and "a run id is a name" in job.stderr, job.stderr
    assert _untouched(victim) and list(results.iterdir()) == []


def test_the_writer_never_writes_or_removes_outside_the_results(tmp_path: Path) -> None:
    """Even a run id that got past the options, or a staging folder that is a link elsewhere."""
    victim = _victim(tmp_path / "victim")
    results = tmp_path / "results"
    with pytest.raises(Exception, match="a run id is a name"):
        Claim.take(results, "../victim", False, "now")
    (results / ".staging").mkdir(parents=True)
    os.symlink(victim, results / ".staging" / "linked")
    with pytest.raises(Exception, match="not inside the results folder"):
        Claim.take(results, "linked", True, "now")
    with pytest.raises(Exception, match="not inside the results folder"):
        Claim.take(results, "linked", False, "now")
    with pytest.raises(Exception, match="not inside the results folder"):
        inside(results, results / "checks" / ".." / ".." / "victim")
    assert check_run_id("20261201T072642-a1b2c3") == "20261201T072642-a1b2c3"
    assert _untouched(victim)


@pytest.mark.parametrize("command", ["sweep", "bench"])
def test_results_at_the_root_or_not_writable_is_exit_2(command: str) -> None:
    assert_usage_error(cli(command, *_quick(command), "--results", "/"), "the filesystem root")
    # /proc/sys is read-only to every process, root included.
    assert_usage_error(cli(command, *_quick(command), "--results", "/proc/sys/harness-results"), "not writable")


def test_results_on_a_read_only_mount_is_exit_2_before_ray_starts(tmp_path: Path) -> None:
    mount = tmp_path / "ro"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro", "tmpfs", str(mount)], capture_output=True, timeout=30)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a read-only tmpfs here ({made.stderr.decode().strip() or made.returncode})")
    try:
        ray_dir = tmp_path / "ray"  # where a Ray started by the command would make its session
        proc = harness("sweep", *QUICK, "--results", str(mount / "results"), timeout=120, env={"RAY_TMPDIR": str(ray_dir)})
        assert_usage_error(proc, "not writable")
        assert not ray_dir.exists(), "refused before Ray starts"
    finally:
        subprocess.run(["umount", str(mount)], capture_output=True, timeout=30)


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--batch-sizes", "1000000000"], "the plan needs about"),
        (["--batch-sizes", "99999999999999999999"], "the plan needs about"),
        (["--episodes", "100000000"], "the plan needs about"),
        (["--batch-sizes", "65536", "--max-memory", "0.01"], "more than --max-memory 0.01 GiB"),
        (["--cards", "1000"], "--cards 1000: 1000 simulated cards"),
        (["--seed=-1"], "--seed -1: must be at least 0 (from 0 to 4294967295)"),
        (["--seed", "99999999999999999999"], "--seed 99999999999999999999: must be at most 4294967295"),
        (["--max-memory", "0"], "--max-memory 0.0: must be more than 0"),
        (["--policy", "hf://owner/name/sub/../model.zip"], "no '.', '..' or empty parts"),
        (["--policy", "hf://own er/name"], "owner and name are letters"),
    ],
)
def test_resource_bombs_and_bad_numbers_are_exit_2_before_ray_starts(tmp_path: Path, args: list[str], expected: str) -> None:
    import ray

    for command in ("sweep", "bench"):
        if command == "bench" and "--episodes" in args:
            continue  # a bench plays no episodes of its own
        proc = cli(command, *BASE, *args, "--results", str(tmp_path / "r"))
        assert_usage_error(proc, expected)
        assert not ray.is_initialized()
    assert not (tmp_path / "r").exists()


def test_a_seed_too_large_in_the_config_file_is_exit_2(tmp_path: Path) -> None:
    config = tmp_path / "sweep.toml"
    config.write_text("seed = 99999999999999999999\n")
    proc = cli("sweep", *QUICK, "--config", str(config), "--results", str(tmp_path / "r"))
    assert_usage_error(proc, "--seed 99999999999999999999: must be at most 4294967295")


def test_a_config_that_is_a_fifo_or_a_device_is_refused_without_reading_it(tmp_path: Path) -> None:
    fifo = tmp_path / "config.toml"
    os.mkfifo(fifo)
    for config, what in ((fifo, "is not a regular file (a FIFO)"), (Path("/dev/zero"), "(a character device)")):
        # A fresh process with a deadline: a FIFO opened for reading would block forever.
        proc = harness("sweep", *QUICK, "--config", str(config), "--results", str(tmp_path / "r"), timeout=60)
        assert_usage_error(proc, what)
    big = tmp_path / "big.toml"
    big.write_text("# " + "x" * (2 * 1024 * 1024))
    assert_usage_error(cli("sweep", *QUICK, "--config", str(big)), "is over the 1048576 byte limit for a config file")
    assert_usage_error(cli("sweep", *QUICK, "--config", str(tmp_path)), "is a folder, not a config file")


def _stored_run(results: Path, run_id: str, config: dict[str, object], checks: list[CheckRow], status: str) -> None:
    row = run_row(status, config)
    with Claim.take(results, run_id, False, row.started_at) as claim:  # released at the end, as by a run that stopped
        if status == "running":
            RunWriter(claim).begin(row)
        else:
            RunWriter(claim).publish({"checks": to_table("checks", checks)}, row)


def test_resume_of_a_run_whose_stored_configuration_no_longer_validates_is_exit_2(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _stored_run(results, "old", {"policies": ["cartpole"], "dtypes": ["float8"]}, [], "running")
    _stored_run(results, "older", {"policies": ["cartpole"], "no_such_option": 1}, [], "running")
    assert_usage_error(
        cli("sweep", "--resume", "old", "--results", str(results)),
        "--resume old: its stored configuration no longer validates",
    )
    assert_usage_error(cli("sweep", "--resume", "older", "--results", str(results)), "is not one this harness reads")


def test_report_of_a_run_with_no_checks_does_not_say_passed(tmp_path: Path) -> None:
    results = tmp_path / "results"
    _stored_run(results, "empty", {}, [], "failed")
    proc = cli("report", "empty", "--results", str(results))
    headline = proc.stdout.splitlines()[0]
    assert "PASSED" not in proc.stdout and headline.startswith("run empty: FAILED"), proc.stdout
    _stored_run(results, "bench-only", {}, [], "bench")
    proc = cli("report", "bench-only", "--results", str(results))
    headline = proc.stdout.splitlines()[0]
    assert proc.returncode == 0, proc.stderr
    assert headline.startswith("run bench-only: BENCH (status bench; 0 of 0 bench rows valid"), headline


@pytest.mark.parametrize("command", ["diagnose", "repro"])
def test_diagnose_and_repro_of_a_killed_sweep_say_how_to_finish_it(tmp_path: Path, command: str) -> None:
    """A sweep killed with SIGKILL once it began: its `runs` row says running, its units wait in
    the staging and it has no `checks` yet; exit 3 with the resume command, as `harness report`."""
    results = tmp_path / "results"
    _stored_run(results, "killed", {"policies": ["cartpole"]}, [], "running")
    proc = harness(command, "killed", "--results", str(results), timeout=120)
    assert proc.returncode == 3 and "Traceback" not in proc.stderr, proc.stderr
    resume = f"harness sweep --resume killed --results {results}"
    assert proc.stderr.strip().splitlines() == [
        f"harness: unfinished: run killed has not finished (status running): it is still running, or it stopped "
        f"before it could record how it ended; finish it with: {resume}"
    ]
    assert f"finish it with: {resume}" in harness("report", "killed", "--results", str(results)).stderr


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--episodes", "3"], "--resume two: --episodes 3, but the run was made with --episodes 2; a resumed run goes on"),
        (["--episodes", "4"], "--episodes 4, but the run was made with --episodes 2"),  # the default, given
        (["--dtypes", "float32"], "--dtypes float32, but the run was made with --dtypes float32,float16,bfloat16"),
        (["--accelerator", "cpu"], "--accelerator cpu, but the run was made with --accelerator auto"),
    ],
)
def test_resume_refuses_an_option_that_differs_from_the_run_s(tmp_path: Path, args: list[str], expected: str) -> None:
    results = tmp_path / "results"
    _stored_run(results, "two", {"policies": ["cartpole"], "episodes": 2}, [], "running")
    assert_usage_error(cli("sweep", "--resume", "two", *args, "--results", str(results)), expected, "leave")
    toml = tmp_path / "resume.toml"
    toml.write_text("episodes = 5\n")
    refused = cli("sweep", "--resume", "two", "--config", str(toml), "--results", str(results))
    assert_usage_error(refused, "--episodes 5, but the run was made with --episodes 2")
    with pytest.raises(UsageError, match="--episodes 6, but the run was made with --episodes 2"):
        sweep(resume="two", episodes=6, results=str(results))  # the Python API alike
    # Where it writes its JUnit file is the invocation's own, as where its results are.
    junit = cli(
        "sweep", "--resume", "two", "--junit-xml", str(tmp_path / "j.xml"), "--episodes", "3", "--results", str(results)
    )
    assert_usage_error(junit, "--episodes 3, but the run was made with --episodes 2")


def test_resume_takes_the_run_s_options_and_applies_only_what_changes_no_outcome(tmp_path: Path) -> None:
    from harness.config.command_plan import resume_config
    from harness.config.options import SweepConfig

    results = tmp_path / "results"
    _stored_run(results, "two", {"policies": ["cartpole"], "episodes": 2, "hang_timeout": 300.0}, [], "running")
    here = SweepConfig(results=str(results), resume="two", episodes=2, hang_timeout=900.0, max_memory_gib=8.0)
    resumed = resume_config(here, "two", {"episodes", "hang_timeout", "max_memory_gib", "run_id"})
    assert (resumed.episodes, resumed.hang_timeout, resumed.max_memory_gib, resumed.results) == (2, 900.0, 8.0, results)
    resumed = resume_config(here, "two", set())  # not given: the run's own, never this invocation's defaults
    assert (resumed.episodes, resumed.hang_timeout, resumed.max_memory_gib) == (2, 300.0, None)
