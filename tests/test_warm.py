"""Warm cards between sweeps (`harness up`, `harness sweep --address`, `harness down`): a warm actor
computes what an actor started for the sweep computes, whatever the sweep before it did, and every
run says which of its actors were warm and which run each served before."""

from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch

from actors.policy_actor import PolicyActor
from actors.warm import Started, WarmCardActor
from harness.cluster import keeper as keeper_module
from harness.cluster.keeper import Keeper, WarmCards
from harness.cluster.warm_record import Recorded, adopt_auth
from harness.devices import SIMULATED, accelerator
from harness.devices.precision import Switch, restore_switches, switch_values
from harness.errors import UsageError
from harness.inference.fault_specs import parse_faults
from harness.policies import PolicySpec, load_policy
from harness.workloads import make_batch
from tests.helpers import REPO, assert_usage_error, cli, read_table

CARTPOLE = [PolicySpec("cartpole")]


@pytest.fixture
def fresh_switches() -> Iterator[None]:
    """The CPU's precision switches as a fresh process has them (another test may have set them
    strict), put back as they were after the test."""
    switches = accelerator(SIMULATED).switches()
    before = switch_values(switches)
    restore_switches(switches, dict.fromkeys(before, "none"))
    try:
        yield
    finally:
        restore_switches(switches, before)


def test_what_a_sweep_leaves_in_a_process_is_put_back_as_it_started(fresh_switches: None) -> None:
    started = Started.now(SIMULATED)
    draws = (random.random(), np.random.random(), torch.rand(1).item())
    threads = torch.get_num_threads()
    accelerator(SIMULATED).apply_precision("strict")  # what a strict sweep leaves
    torch.set_num_threads(threads + 1)
    cpu = accelerator(SIMULATED)
    assert switch_values(cpu.switches()) != started.switches, "the sweep before must have changed them"
    started.restore()
    assert switch_values(cpu.switches()) == started.switches
    assert torch.get_num_threads() == threads
    assert (random.random(), np.random.random(), torch.rand(1).item()) == draws


def test_a_switch_that_cannot_be_set_back_is_refused() -> None:
    """A switch with no `restore` (torch_npu's) goes back to its strict value only."""
    value = {"on": True}
    switch = Switch("toy.allow_low_precision", False, lambda: value["on"], lambda: value.update(on=False))
    restore_switches([switch], {switch.name: False})
    assert value["on"] is False
    with pytest.raises(UsageError, match=r"toy\.allow_low_precision cannot be set back to True in a running process"):
        restore_switches([switch], {switch.name: True})


def test_a_warm_card_computes_as_a_fresh_one_after_a_sweep_with_a_fault_and_another_precision(
    fresh_switches: None, tmp_path: Path
) -> None:
    """In this process (a Ray worker builds them from the same arguments)."""
    batch = make_batch(load_policy("cartpole").info, "normal", 8, seed=0)
    warm = WarmCardActor(SIMULATED, 0)
    warm.begin("run-a", CARTPOLE, 2, "device-default", parse_faults(["all:corrupt-weight"]), f"{tmp_path}/a")
    assert warm.describe().device.settings["precision"] == "device-default"
    faulty = warm.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    warm.begin("run-b", CARTPOLE, 1, "strict", [], f"{tmp_path}/b")
    warmed = warm.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    fresh = PolicyActor(SIMULATED, 0, CARTPOLE, 1, "strict", [], f"{tmp_path}/c")
    cold = fresh.run_batch("cartpole", "float32", batch.obs, batch.noise).value
    assert not all(np.array_equal(faulty[name], cold[name]) for name in cold), "the fault must have struck"
    assert all(np.array_equal(warmed[name], cold[name]) for name in cold)
    described = warm.describe()
    assert (described.warm, described.served_before, described.faults) == (True, "run-a", ())
    assert described.device.settings == fresh.describe().device.settings
    assert fresh.describe().record()["warm"] is False


def test_the_keeper_lends_the_cards_to_one_driver_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    alive = {"job-a", "job-b"}
    monkeypatch.setattr(keeper_module, "job_alive", lambda job: job in alive)
    keeper = Keeper(WarmCards(SIMULATED, 2, None, 60.0))  # type: ignore[arg-type]  # no placement group here
    assert keeper.lease("run-a", "job-a") is None
    assert keeper.lease("run-b", "job-b") == "run-a", "held by a live driver"
    assert keeper.idle_s() == 0.0, "not idle while lent"
    alive.discard("job-a")  # its driver ended, however it ended
    assert keeper.lease("run-b", "job-b") is None
    keeper.stop()
    assert keeper.idle_s() is None


def test_down_with_nothing_up_is_exit_2(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_WARM_FILE", str(tmp_path / "warm.json"))
    proc = cli("down")
    assert_usage_error(proc, "no warm cards are up (none recorded in")
    proc = cli("down", "--address", "127.0.0.1:1")
    assert_usage_error(proc, "no warm cards are up at 127.0.0.1:1: nothing answers there")


def test_up_while_warm_cards_are_up_is_exit_2_before_ray_starts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HARNESS_WARM_FILE", str(tmp_path / "warm.json"))
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        address = f"127.0.0.1:{listening.getsockname()[1]}"
        (tmp_path / "warm.json").write_text(f'{{"address": "{address}", "pid": {os.getpid()}, "auth": ""}}')
        proc = cli("up", "--accelerator", "cpu")
    assert_usage_error(proc, f"warm cards are already up at {address} (process {os.getpid()})")
    # The record of an `up` whose cluster is gone (nothing answers there now): `down` forgets it.
    assert_usage_error(cli("down"), f"no warm cards are up at {address}: nothing answers there")
    assert not (tmp_path / "warm.json").exists()


def test_a_command_joins_the_warm_cards_in_the_auth_mode_their_cluster_started_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Ray reads RAY_AUTH_MODE once, when it is imported: the mode is taken from the record before
    that, for the recorded address only, and never over the user's own."""
    # adopt_auth sets RAY_AUTH_MODE in os.environ itself, which monkeypatch would not put back: the
    # whole environment is put back after the test instead.
    with mock.patch.dict(os.environ):
        os.environ["HARNESS_WARM_FILE"] = str(tmp_path / "warm.json")
        Recorded("192.0.2.2:6379", os.getpid(), "token").write()
        os.environ.pop("RAY_ADDRESS", None)
        os.environ.pop("RAY_AUTH_MODE", None)
        monkeypatch.delitem(sys.modules, "ray", raising=False)
        for elsewhere in (None, "192.0.2.2:6380"):  # a private cluster; another cluster
            adopt_auth(elsewhere)
            assert "RAY_AUTH_MODE" not in os.environ
        os.environ["RAY_ADDRESS"] = "192.0.2.2:6379"
        adopt_auth(None)
        assert os.environ["RAY_AUTH_MODE"] == "token"
        os.environ["RAY_AUTH_MODE"] = "disabled"
        adopt_auth("192.0.2.2:6379")
        assert os.environ["RAY_AUTH_MODE"] == "disabled"
        os.environ.pop("RAY_AUTH_MODE", None)
        monkeypatch.setitem(sys.modules, "ray", sys)  # imported already: too late to take effect
        adopt_auth("192.0.2.2:6379")
        assert "RAY_AUTH_MODE" not in os.environ


# A real `harness up` ---------------------------------------------------------------------------

SWEEP = ("--policy", "cartpole", "--dtypes", "float32,float16", "--batch-sizes", "1,8", "--episodes", "2")
# What differs between equal runs: their id and the unit ids that derive from nothing else.
NOT_COMPARED = ("run_id",)


@dataclass
class Up:
    process: subprocess.Popen[str]
    address: str
    env: dict[str, str]
    said: list[str]


@pytest.fixture(scope="module")
def warm_cards(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    """`harness up` as a user starts it, in a process session of its own; always `harness down`
    after, and the process killed where it did not end."""
    folder = tmp_path_factory.mktemp("warm")
    env = {**os.environ, "HARNESS_WARM_FILE": str(folder / "warm.json")}
    env.pop("RAY_ADDRESS", None)
    # Unset, as a user's shell has it: the sweeps and `harness down` take the cluster's mode from
    # the record `harness up` leaves (Ray 2.60's local cluster wants a token).
    env.pop("RAY_AUTH_MODE", None)
    process = subprocess.Popen(
        [sys.executable, "-m", "harness", "up", "--accelerator", "cpu", "--idle-timeout", "900"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=REPO,
        env=env,
        start_new_session=True,
    )
    said: list[str] = []
    try:
        assert process.stdout is not None
        for line in process.stdout:
            said.append(line.rstrip())
            if line.startswith("use them: "):
                break
        assert said and said[-1].startswith("use them: "), "\n".join(said)
        address = said[-1].split("--address ")[1].split()[0]
        yield Up(process, address, env, said)
        down = subprocess.run(
            [sys.executable, "-m", "harness", "down"], capture_output=True, text=True, cwd=REPO, env=env, timeout=120
        )
        assert down.returncode == 0, down.stderr
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            os.killpg(process.pid, 9)
            process.wait()


def harness(up: Up, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=REPO, env=up.env, timeout=timeout
    )


def sweep(up: Up, results: Path, *args: str, warm: bool = True) -> subprocess.CompletedProcess[str]:
    where = ("--address", up.address) if warm else ()
    return harness(up, "sweep", *SWEEP, *args, "--accelerator", "cpu", "--no-progress", "--results", str(results), *where)


def rows(results: Path, table: str) -> pa.Table:
    """The table's rows in a fixed order, without the columns in which equal runs differ."""
    found = read_table(results, table)
    found = found.drop_columns([c for c in NOT_COMPARED if c in found.column_names])
    keys = [(name, "ascending") for name in found.column_names if not pa.types.is_floating(found.schema.field(name).type)]
    return found.take(pc.sort_indices(found, sort_keys=keys))


def runs_row(results: Path) -> dict[str, object]:
    [row] = read_table(results, "runs").to_pylist()
    return dict(row)


def devices(results: Path) -> list[dict[str, object]]:
    return list(json.loads(str(runs_row(results)["devices"])))


@pytest.mark.slow
def test_a_sweep_on_warm_cards_finds_what_a_cold_one_does_even_after_a_sweep_and_a_bench_with_faults(
    warm_cards: Up, tmp_path: Path
) -> None:
    started = next(line for line in warm_cards.said if line.startswith("warm cards up at "))
    assert "they stop after 900 s without a sweep" in started, warm_cards.said
    cold = sweep(warm_cards, tmp_path / "cold", warm=False)
    assert cold.returncode == 0, cold.stdout + cold.stderr
    first = sweep(warm_cards, tmp_path / "first")
    assert first.returncode == 0, first.stdout + first.stderr
    assert "using the warm cards of harness up" in first.stdout
    faulty = ("--inject-fault", "all:corrupt-weight", "--precision", "device-default", "--threads", "2")
    other = sweep(warm_cards, tmp_path / "other", *faulty)
    assert other.returncode == 1, other.stdout + other.stderr  # the fault struck
    # A bench on the same warm cards, its timed path faulty on card 1: its audit finds it.
    bench = harness(
        warm_cards,
        *("bench", "--accelerator", "cpu", "--address", warm_cards.address, "--results", str(tmp_path / "bench")),
        *("--policy", "cartpole", "--batch-sizes", "8", "--duration", "0.02", "--inject-fault", "card1:reduced-fp32"),
    )
    assert bench.returncode == 1, bench.stdout[-3000:] + bench.stderr[-2000:]
    assert "using the warm cards of harness up: 2 of 2 card(s)" in bench.stdout
    failed = [c for c in read_table(tmp_path / "bench", "checks").to_pylist() if not c["passed"]]
    assert failed and {c["device_a"] for c in failed} == {"sim-cpu1"}
    assert {(d["warm"], d["served_before"]) for d in devices(tmp_path / "bench")} == {
        (True, runs_row(tmp_path / "other")["run_id"])
    }
    again = sweep(warm_cards, tmp_path / "again")
    assert again.returncode == 0, again.stdout + again.stderr
    for table in ("checks", "episodes"):
        expected = rows(tmp_path / "cold", table)
        assert expected.num_rows
        for results in ("first", "again"):
            assert rows(tmp_path / results, table).equals(expected), (table, results)
        assert not rows(tmp_path / "other", table).equals(expected), "the faulty run must differ"
    assert {(d["warm"], d["served_before"]) for d in devices(tmp_path / "cold")} == {(False, None)}
    # The cards served the bench before; the CPU reference, which a bench leaves idle, the sweep before it.
    served = {d["label"]: (d["warm"], d["served_before"]) for d in devices(tmp_path / "again")}
    bench_run, other_run = runs_row(tmp_path / "bench")["run_id"], runs_row(tmp_path / "other")["run_id"]
    assert served == {"sim-cpu0": (True, bench_run), "sim-cpu1": (True, bench_run), "cpu": (True, other_run)}


@pytest.mark.slow
def test_what_warm_cards_refuse_is_one_line_and_exit_2(warm_cards: Up, tmp_path: Path) -> None:
    crash = sweep(warm_cards, tmp_path, "--inject-fault", "card0:crash-once")
    assert_usage_error(crash, "--inject-fault card0:crash-once: it acts on a card's process, and warm cards keep theirs")
    again = harness(warm_cards, "up", "--accelerator", "cpu", timeout=120)
    assert_usage_error(again, f"warm cards are already up at {warm_cards.address}")
    assert warm_cards.process.poll() is None, "the first one is still up"


@pytest.mark.slow
def test_warm_cards_stop_after_their_idle_timeout(tmp_path: Path) -> None:
    env = {**os.environ, "HARNESS_WARM_FILE": str(tmp_path / "warm.json")}
    done = subprocess.run(
        [sys.executable, "-m", "harness", "up", "--accelerator", "cpu", "--cards", "1", "--idle-timeout", "1"],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "they stop after 1 s without a sweep" in done.stdout
    assert done.stdout.rstrip().endswith("warm cards down: idle for 1 s"), done.stdout
    assert not (tmp_path / "warm.json").exists()
