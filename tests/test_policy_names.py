"""A policy's name where a run is shown: the shortest end of its path no other policy of the run
shares, in the summary, on the sign-off page and on the comparison page alike."""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

from harness.report.names import PolicyNames
from harness.judge.outcome import Verdict
from harness.report.summary import print_summary
from harness.store.schema import CheckRow
from harness.store.writer import to_table, write_rows
from tests.helpers import cli
from tests.test_report import check_row

ZOO = "/data/rl-trained-agents"
PPO, SAC = (f"{ZOO}/{algo}/Pendulum-v1_1/Pendulum-v1.zip" for algo in ("ppo", "sac"))


def test_a_policy_is_named_by_the_shortest_end_of_its_path_no_other_policy_shares() -> None:
    names = PolicyNames.of(["cartpole", PPO, SAC, f"{ZOO}/ppo/CartPole-v1_1/CartPole-v1.zip", "hf://sb3/ppo-CartPole-v1"])
    assert names.labels == {
        "cartpole": "cartpole",
        PPO: "ppo/Pendulum-v1_1",  # the file only repeats its folder's name: left off
        SAC: "sac/Pendulum-v1_1",
        f"{ZOO}/ppo/CartPole-v1_1/CartPole-v1.zip": "CartPole-v1.zip",  # unique: the file name alone
        "hf://sb3/ppo-CartPole-v1": "ppo-CartPole-v1",
    }
    assert names(PPO) != names(SAC) and names.width == len("ppo/Pendulum-v1_1")


def test_a_name_keeps_what_tells_it_apart() -> None:
    """The file stays where leaving it off would name two policies alike; a path that is the end of
    another reads as given."""
    names = PolicyNames.of(["a/F_1/F.zip", "b/F_1/F.zip", "a/F_1/F.pt", "c/F_1/F.pt", "x/b.zip", "y/x/b.zip"])
    assert names.labels == {
        "a/F_1/F.zip": "a/F_1/F.zip",
        "b/F_1/F.zip": "b/F_1",
        "a/F_1/F.pt": "a/F_1/F.pt",
        "c/F_1/F.pt": "c/F_1",
        "x/b.zip": "x/b.zip",
        "y/x/b.zip": "y/x/b.zip",
    }
    assert len(set(names.labels.values())) == len(names.labels)


def two_agents_of_one_env() -> list[CheckRow]:
    return [replace(check_row(True, 0.01), policy=policy) for policy in (PPO, SAC)]


def test_the_summary_names_two_agents_of_one_environment_apart() -> None:
    out = io.StringIO()
    print_summary(to_table("checks", two_agents_of_one_env()), "r", Verdict.PASSED, out)
    rows = [line.split()[0] for line in out.getvalue().splitlines()[2:4]]
    assert rows == ["ppo/Pendulum-v1_1", "sac/Pendulum-v1_1"], out.getvalue()


def test_the_sign_off_and_comparison_pages_name_two_agents_of_one_environment_apart(tmp_path: Path) -> None:
    for run in ("a", "b"):
        write_rows(tmp_path, "checks", run, two_agents_of_one_env())
    page = cli("report", "a", "--results", str(tmp_path), "--out", str(tmp_path / "page"))
    compare = cli("report", "--compare", "a", "b", "--results", str(tmp_path), "--out", str(tmp_path / "page"))
    assert page.returncode == 0 and compare.returncode == 0, page.stderr + compare.stderr
    for html in (tmp_path / "page").glob("*.html"):
        text = html.read_text()
        assert f'title="{PPO}">ppo/Pendulum-v1_1<' in text and f'title="{SAC}">sac/Pendulum-v1_1<' in text, html.name
    assert len(list((tmp_path / "page").glob("*.html"))) == 2


def test_a_policy_the_run_did_not_name_reads_as_its_file() -> None:
    assert PolicyNames.of([]).width == 0 and PolicyNames.of([])("a/b.zip") == "b.zip"
