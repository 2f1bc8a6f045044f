"""MuJoCo agents (the `mujoco` extra): the -v2 and -v3 ids that published agents name, which
gymnasium 1.x registers only to refuse them, played as -v4 with the old ids' spaces; agents that
SB3 builds on -v4 and -v5 loaded and played as SB3 plays them; and an agent saved naming
HalfCheetah-v3 swept end to end by the real command, its episodes on HalfCheetah-v4, the mapping
recorded, and the score SB3 published for it compared."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, replace
from collections.abc import Callable
from pathlib import Path
from typing import Any, SupportsFloat

import gymnasium as gym
import numpy as np
import pytest
import torch
from numpy.typing import NDArray
from stable_baselines3 import PPO, SAC, TD3
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.monitor import Monitor
from stable_baselines3.common.vec_env import DummyVecEnv

from harness.envs.lockstep import GymEnvs
from harness.envs.registry import check_env
from harness.envs.renames import MUJOCO, RENAMES, Rename
from harness.envs.spec import EnvSpec, is_registered, make_env, require_registered
from harness.envs.versions import MujocoPy2Contacts
from harness.errors import UsageError
from harness.judge.verdicts import HONEST
from harness.policies import load_policy
from harness.policies.policy_files import PLAIN, EnvSetup, Wrapper
from harness.sweeps.plan import with_gymnasium_id
from tests.builders import redraw_weights, write_zoo_files, zoo_yaml
from tests.conftest import Head
from tests.helpers import harness, read_table

pytest.importorskip("mujoco", reason="the mujoco extra is not installed (pip install -e '.[mujoco]')")


def made(env_id: str, **kwargs: Any) -> gym.Env[Any, Any]:
    """The environment as the harness makes it (MuJoCo's warnings to Python's, not to MUJOCO_LOG.TXT)."""
    return make_env(EnvSpec(env_id, EnvSetup(kwargs=tuple(kwargs.items()))))[0]


def small() -> dict[str, Any]:
    """policy_kwargs of their own for each model: SB3 writes into the dict it is given (SAC's use_sde)."""
    return {"net_arch": [32, 32]}


OFF = {"buffer_size": 10, "device": "cpu", "seed": 0}
STEPS = 200  # of random actions, episodes restarted where they end: contact forces and costs far from zero


def test_every_mujoco_rename_gives_the_old_ids_spaces() -> None:
    """gymnasium registers each old id only to refuse it; the id it is mapped to, made with the
    rename's keyword arguments, gives the old one's observation shape and Box of actions."""
    for old, rename in MUJOCO.items():
        assert old in gym.registry and not is_registered(old), old
        with pytest.raises(ImportError, match="moved to the gymnasium-robotics project"):
            gym.make(old)
        assert rename.spaces is not None and RENAMES[old] is rename
        env, _ = make_env(EnvSpec(rename.env_id, rename.setup(PLAIN)))
        try:
            assert env.observation_space.shape == rename.spaces.observation, old
            assert isinstance(env.action_space, gym.spaces.Box) and env.action_space.shape == (rename.spaces.actions,), old
            assert np.all(env.action_space.high == rename.spaces.action_bound), old
            assert np.all(env.action_space.low == -rename.spaces.action_bound), old
        finally:
            env.close()


def test_the_differences_the_mujoco_renames_state_are_v4s() -> None:
    """What each rename says of v4 beside mujoco-py 2.x's contact forces, checked on v4 itself:
    the ids whose rename says it takes no xml_file refuse one (Ant-v4 takes its own), Walker2d's
    feet keep their unequal friction, InvertedDoublePendulum's constraint forces read zero."""
    for old, rename in MUJOCO.items():
        refuses = "takes no xml_file" in rename.change
        assert refuses == (rename.env_id in {"HalfCheetah-v4", "Hopper-v4", "Walker2d-v4", "Swimmer-v4", "Humanoid-v4"}), old
        if refuses:
            with pytest.raises(UsageError, match="unexpected keyword argument 'xml_file'"):
                made(rename.env_id, xml_file="model.xml")
    made("Ant-v4", xml_file="ant.xml").close()
    assert "0.9 and 1.9" in MUJOCO["Walker2d-v3"].change
    walker = made("Walker2d-v4").unwrapped
    frictions = {name: walker.model.geom(name).friction[0] for name in ("foot_geom", "foot_left_geom")}  # type: ignore[attr-defined]
    assert frictions == {"foot_geom": pytest.approx(0.9), "foot_left_geom": pytest.approx(1.9)}
    assert "last 3 observations (qfrc_constraint) read zero" in MUJOCO["InvertedDoublePendulum-v2"].change
    pendulum = made("InvertedDoublePendulum-v4")
    pendulum.reset(seed=0)
    pendulum.action_space.seed(0)
    for _ in range(STEPS):
        obs, _, terminated, truncated, _ = pendulum.step(pendulum.action_space.sample())
        assert not np.any(obs[-3:])
        if terminated or truncated:
            pendulum.reset()


def test_an_old_id_with_no_mapping_is_refused_in_one_line() -> None:
    with pytest.raises(UsageError) as refused:
        require_registered("Pusher-v2")
    message = str(refused.value)
    assert "registered in gymnasium" in message and "only to be refused" in message and "\n" not in message


def test_ant_v3_plays_v4_with_contact_forces_which_its_policy_needs(tmp_path: Path) -> None:
    """Ant-v3 observed 111 values; Ant-v4 observes 27 unless made with use_contact_forces=True,
    which the rename adds to the setup, with the range that clips the contact forces to
    mujoco-py 2.x's zero: without it the policy's spaces do not fit."""
    model = PPO("MlpPolicy", made("Ant-v4", use_contact_forces=True), policy_kwargs=small(), device="cpu", seed=0)
    model.save(tmp_path / "Ant-v3.zip")
    run = write_zoo_files(tmp_path, "Ant-v3", [("policy", "MlpPolicy")])
    (run / "args.yml").write_text(zoo_yaml([("algo", "ppo"), ("env", "Ant-v3"), ("env_kwargs", {"ctrl_cost_weight": 0.4})]))
    policy = with_gymnasium_id(load_policy(str(tmp_path / "Ant-v3.zip")))
    info = policy.info
    assert (info.env_id, info.env_renamed_from) == ("Ant-v4", "Ant-v3")
    assert info.env_setup.kwargs == (
        ("use_contact_forces", True),
        ("contact_force_range", (0.0, 0.0)),
        ("ctrl_cost_weight", 0.4),
    )
    assert "Ant-v3 is Ant-v4 with use_contact_forces=True, contact_force_range=(0.0, 0.0) since gymnasium 1.0.0" in (
        info.env_source
    )
    assert "contact forces, which mujoco-py 2.x left at zero" in info.env_source
    check_env(EnvSpec.played_by(info), info)  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="its observations flatten to 27 values, the policy takes 111"):
        check_env(EnvSpec("Ant-v4"), info)


# --- mujoco-py 2.x's contact forces: zero in the observation and in the reward ----------------


@dataclass(frozen=True)
class RealContacts:
    """An old id's -v4 as the bindings make it, computing its contact forces (as the harness made
    it before): its keyword arguments, where the forces are in its observation, and the contact
    cost its reward pays, from what its step returns."""

    kwargs: dict[str, Any]
    forces: slice
    cost: Callable[[NDArray[np.float64], dict[str, Any]], float]


REAL_CONTACTS = {
    # v3's contact cost: contact_cost_weight 5e-4 times the clipped forces squared, which v4 observes.
    "Ant-v3": RealContacts({"use_contact_forces": True}, slice(27, 111), lambda obs, _: 5e-4 * float(np.sum(obs[27:] ** 2))),
    # v4 dropped v3's contact cost from the reward: it pays none.
    "Humanoid-v3": RealContacts({}, slice(292, 376), lambda _, __: 0.0),
    "HumanoidStandup-v2": RealContacts({}, slice(292, 376), lambda _, info: -float(info["reward_impact"])),
}


@dataclass(frozen=True)
class Rollout:
    """How an environment made for an old id departed from mujoco-py 2.x's, over STEPS steps side
    by side with the -v4 that computes contact forces (same seeds, same actions: the forces move
    neither the bodies nor the episode's end), and how large those forces and costs were there."""

    gaps: frozenset[str]
    largest_force: float
    largest_cost: float


def mujoco_py2_gaps(old: str, env: gym.Env[Any, Any]) -> Rollout:
    """mujoco-py 2.x's `old` observes what the bindings' -v4 observes, its contact forces zero, and
    is rewarded as it is, its contact cost given back."""
    real = REAL_CONTACTS[old]
    reference = made(MUJOCO[old].env_id, **real.kwargs)
    rng = np.random.default_rng(0)
    gaps: set[str] = set()
    forces, costs = [0.0], [0.0]
    obs, ref = env.reset(seed=0)[0], reference.reset(seed=0)[0]
    for _ in range(STEPS):
        rest = np.ones(ref.shape, dtype=bool)
        rest[real.forces] = False
        if not np.array_equal(obs[rest], ref[rest]):
            gaps.add("observes other bodies")
        if np.any(obs[real.forces] != 0.0):
            gaps.add("observes contact forces")
        forces.append(float(np.max(np.abs(ref[real.forces]))))
        action = rng.uniform(reference.action_space.low, reference.action_space.high)
        obs, reward, terminated, truncated, _ = env.step(action)
        ref, ref_reward, ref_terminated, ref_truncated, info = reference.step(action)
        costs.append(real.cost(ref, info))
        assert (terminated, truncated) == (ref_terminated, ref_truncated), "the episodes are the same"
        if float(reward) != pytest.approx(float(ref_reward) + costs[-1], rel=0, abs=1e-9):
            gaps.add("pays the contact cost")
        if terminated or truncated:
            obs, ref = env.reset()[0], reference.reset()[0]
    env.close()
    reference.close()
    return Rollout(frozenset(gaps), max(forces), max(costs))


def played(old: str, rename: Rename | None = None) -> gym.Env[Any, Any]:
    """The environment the harness plays for `old`, by its rename."""
    return make_env(EnvSpec((rename or MUJOCO[old]).env_id, (rename or MUJOCO[old]).setup(PLAIN)))[0]


def without_mujoco_py2(rename: Rename) -> Rename:
    """`rename` as it was before mujoco-py 2.x's contact forces were restored: only the keyword
    that gives Ant its 111 observations, and no wrapper."""
    return replace(rename, kwargs=tuple((k, v) for k, v in rename.kwargs if k == "use_contact_forces"), wrappers=())


@pytest.mark.parametrize("old", list(REAL_CONTACTS))
def test_contact_forces_are_zero_and_cost_nothing_as_under_mujoco_py_2(old: str) -> None:
    """Ant-v3, Humanoid-v3 and HumanoidStandup-v2 in the old observation layout, their contact
    forces zero over a rollout where the bindings' are not, every other observation the same, and
    the reward v4's with the contact cost v4 charges for those forces given back."""
    env = played(old)
    assert env.observation_space.shape == MUJOCO[old].spaces.observation  # type: ignore[union-attr]
    rollout = mujoco_py2_gaps(old, env)
    assert rollout.gaps == frozenset(), rollout
    assert rollout.largest_force > 0.5, "the bindings compute the contact forces the old id did not"
    if old != "Humanoid-v3":
        assert rollout.largest_cost > 1e-3, "the reward v4 gives pays for them"


@pytest.mark.parametrize("old", list(REAL_CONTACTS))
def test_fault_without_the_mujoco_py_2_change_the_contact_forces_are_observed_and_paid_for(old: str) -> None:
    """The rename as it was (Ant-v4 with use_contact_forces=True alone, Humanoid-v4 unwrapped):
    the same check finds the forces in the observation, and the cost in Ant's and
    HumanoidStandup's reward."""
    rollout = mujoco_py2_gaps(old, played(old, without_mujoco_py2(MUJOCO[old])))
    paid = {"pays the contact cost"} if old != "Humanoid-v3" else set()
    assert rollout.gaps == {"observes contact forces", *paid}, rollout


def test_humanoid_v4s_reward_is_v3s_under_mujoco_py_2_without_its_contact_cost() -> None:
    """Humanoid-v4 dropped the contact cost that v3 charged (5e-7 times the forces, clipped
    above at 10, squared): mujoco-py 2.x made it zero, so v4's reward is v3's as its agents were
    trained on, its healthy, forward and control terms only, while the forces v4 computes would
    have cost something."""
    env = played("Humanoid-v3")
    env.reset(seed=0)
    env.action_space.seed(0)
    v3_costs = []
    for _ in range(STEPS):
        _, reward, terminated, truncated, info = env.step(env.action_space.sample())
        assert float(reward) == info["reward_linvel"] + info["reward_alive"] + info["reward_quadctrl"]
        forces = env.unwrapped.data.cfrc_ext  # type: ignore[attr-defined]
        v3_costs.append(5e-7 * float(np.sum(np.minimum(forces, 10.0) ** 2)))
        if terminated or truncated:
            env.reset()
    assert max(v3_costs) > 0.0


def test_the_recorder_counts_the_old_versions_reward_under_the_agents_wrappers() -> None:
    """MujocoPy2Contacts is part of the environment: the EpisodeRecorder records HumanoidStandup's
    rewards without the impact cost, under a wrapper of the run files (ClipReward) that the agent
    saw around it."""
    rename = MUJOCO["HumanoidStandup-v2"]
    clip = Wrapper("gymnasium.wrappers.ClipReward", (("min_reward", -1.0), ("max_reward", 1.0)))
    env, recorder = make_env(EnvSpec(rename.env_id, rename.setup(EnvSetup(wrappers=(clip,)))))
    assert isinstance(recorder.env, MujocoPy2Contacts) and isinstance(env, gym.wrappers.ClipReward)
    reference = made("HumanoidStandup-v4")
    env.reset(seed=0)
    reference.reset(seed=0)
    reference.action_space.seed(0)
    old_rewards, impact = 0.0, 0.0
    for _ in range(20):
        action = reference.action_space.sample()
        _, clipped, *_ = env.step(action)
        _, reward, *_, info = reference.step(action)
        assert float(clipped) == 1.0
        old_rewards += float(reward) - float(info["reward_impact"])
        impact -= float(info["reward_impact"])
    assert impact > 0.0 and recorder.take_reward() == pytest.approx(old_rewards, rel=1e-12)


def test_mujoco_py2_contacts_refuses_an_observation_without_contact_forces() -> None:
    contacts = Wrapper("harness.envs.versions.MujocoPy2Contacts")
    with pytest.raises(
        UsageError, match=r"cannot wrap HalfCheetah-v4: observations of shape \(17,\) do not end with 48 contact"
    ):
        make_env(EnvSpec("HalfCheetah-v4", EnvSetup(wrappers=(contacts,))))


def test_a_humanoid_v3_agent_plays_v4_wrapped_and_env_source_says_so(tmp_path: Path) -> None:
    """An agent saved naming Humanoid-v3 plays Humanoid-v4 in MujocoPy2Contacts: its setup carries
    the wrapper (so every actor makes it), env_source says why, and the environment it plays
    observes zero contact forces."""
    model = PPO("MlpPolicy", made("Humanoid-v4"), policy_kwargs=small(), device="cpu", seed=0)
    model.save(tmp_path / "Humanoid-v3.zip")
    write_zoo_files(tmp_path, "Humanoid-v3", [("policy", "MlpPolicy")])
    info = with_gymnasium_id(load_policy(str(tmp_path / "Humanoid-v3.zip"))).info
    assert (info.env_id, info.env_renamed_from) == ("Humanoid-v4", "Humanoid-v3")
    assert info.env_setup.wrappers == (Wrapper("harness.envs.versions.MujocoPy2Contacts"),)
    assert "Humanoid-v3 is Humanoid-v4 in harness.envs.versions.MujocoPy2Contacts since gymnasium 1.0.0" in info.env_source
    assert "contact forces, which mujoco-py 2.x left at zero" in info.env_source and "zeroes them" in info.env_source
    spec = EnvSpec.played_by(info)
    assert spec is not None and spec.key == "Humanoid-v4 [wrappers harness.envs.versions.MujocoPy2Contacts]"
    check_env(spec, info)
    env, _ = make_env(spec)
    env.reset(seed=0)
    env.action_space.seed(0)
    computed = []
    for _ in range(STEPS):
        obs, _, terminated, truncated, _ = env.step(env.action_space.sample())
        assert not np.any(obs[-84:])
        computed.append(np.any(env.unwrapped.data.cfrc_ext))  # type: ignore[attr-defined]
        if terminated or truncated:
            env.reset()
    assert any(computed), "the bindings computed contact forces, which the agent does not see"
    env.close()


class MujocoPy2Ant(gym.Wrapper[Any, Any, Any, Any]):
    """The oracle, apart from the harness: Ant-v4 with use_contact_forces=True as mujoco-py 2.x
    gave Ant-v3, its 84 contact forces zeroed after the bindings computed them and their contact
    cost (5e-4 times their squares) given back."""

    def reset(self, **kwargs: Any) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        return np.concatenate([obs[:27], np.zeros(84)]), info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = self.env.step(action)
        reward = float(reward) + 5e-4 * float(np.sum(obs[27:] ** 2))
        return np.concatenate([obs[:27], np.zeros(84)]), reward, terminated, truncated, info


def test_an_ant_v3_agent_scores_in_the_harness_what_sb3_scores_under_mujoco_py_2(tmp_path: Path) -> None:
    """The published score is the judge: an agent saved naming Ant-v3 returns, in the environment
    the harness plays for it (its episodes as the actors play them, GymEnvs), what SB3's
    evaluate_policy gives it on mujoco-py 2.x's Ant, seed by seed; under the mapping as it was,
    with the contact forces the bindings compute, it returns something else."""
    model = PPO("MlpPolicy", made("Ant-v4", use_contact_forces=True), policy_kwargs=small(), device="cpu", seed=0)
    redraw_weights(model)
    model.save(tmp_path / "Ant-v3.zip")
    write_zoo_files(tmp_path, "Ant-v3", [("policy", "MlpPolicy")])
    policy = with_gymnasium_id(load_policy(str(tmp_path / "Ant-v3.zip")))
    spec = EnvSpec.played_by(policy.info)
    assert spec is not None

    def played_return(env: EnvSpec, seed: int) -> float:
        envs = GymEnvs(env, 1)
        (obs,), total = envs.reset([seed]), 0.0
        while True:
            with torch.inference_mode():
                action = policy.deterministic_action(policy(torch.from_numpy(obs.astype(np.float32))))
            (obs,), rewards, terminated, truncated = envs.step(np.clip(action.numpy(), -1.0, 1.0))
            total += float(rewards[0])
            if terminated[0] or truncated[0]:
                envs.close()
                return total

    old = EnvSpec(spec.env_id, without_mujoco_py2(MUJOCO["Ant-v3"]).setup(PLAIN))
    for seed in range(3):
        venv = DummyVecEnv([lambda: Monitor(MujocoPy2Ant(made("Ant-v4", use_contact_forces=True)))])
        venv.seed(seed)
        [sb3], _ = evaluate_policy(model, venv, n_eval_episodes=1, deterministic=True, return_episode_rewards=True)
        assert played_return(spec, seed) == pytest.approx(sb3, rel=0, abs=1e-6), seed
        assert abs(played_return(old, seed) - sb3) > 1.0, seed


AGENTS: dict[str, tuple[Callable[[gym.Env[Any, Any]], BaseAlgorithm], str]] = {
    "sac-halfcheetah-v5": (lambda env: SAC("MlpPolicy", env, policy_kwargs=small(), **OFF), "HalfCheetah-v5"),
    "td3-walker2d-v4": (lambda env: TD3("MlpPolicy", env, policy_kwargs=small(), **OFF), "Walker2d-v4"),
    "ppo-hopper-v5-trained": (
        lambda env: PPO("MlpPolicy", env, policy_kwargs=small(), n_steps=128, batch_size=64, n_epochs=1, device="cpu", seed=0),
        "Hopper-v5",
    ),
}


@pytest.mark.parametrize("name", list(AGENTS))
def test_agents_sb3_builds_on_v4_and_v5_load_and_play_as_sb3_plays_them(name: str, tmp_path: Path) -> None:
    """Along an episode SB3 plays (200 steps), the harness's action for each observation is the
    one SB3's predict chose."""
    make, env_id = AGENTS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # gymnasium's note that v4 is not the newest
        model = make(made(env_id))
        if name.endswith("trained"):
            model.learn(256)  # a few hundred steps: the weights of a run, not of an initializer
        else:
            redraw_weights(model)
    model.save(tmp_path / "agent.zip")
    policy = load_policy(str(tmp_path / "agent.zip"))
    check_env(env_id, policy.info)
    env = made(env_id)
    obs, _ = env.reset(seed=0)
    for _ in range(200):
        action = model.predict(obs, deterministic=True)[0]
        with torch.inference_mode():
            ours = policy.deterministic_action(policy(torch.from_numpy(obs[None].astype(np.float32))))
        np.testing.assert_allclose(np.clip(ours.numpy()[0], env.action_space.low, env.action_space.high), action, atol=1e-6)
        obs, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            obs, _ = env.reset()
    env.close()


# --- end to end: an agent naming HalfCheetah-v3, swept by the real command ----------------------

ENV_ID = "HalfCheetah-v3"
EPISODES = 2  # the sweep's --seed 0: seeds 0 and 1


@pytest.fixture(scope="module")
def cheetah(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, float]:
    """An untrained SAC built on HalfCheetah-v4 (the spaces of v3), saved in the RL Zoo's layout
    naming HalfCheetah-v3, with the score SB3's evaluate_policy gives it on v4 over the sweep's
    seeds in results.json beside the zip, as huggingface_sb3 publishes one."""
    folder = tmp_path_factory.mktemp("cheetah")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = SAC("MlpPolicy", made("HalfCheetah-v4"), policy_kwargs=small(), **OFF)
        redraw_weights(model)
        model.save(folder / f"{ENV_ID}.zip")
        returns = []
        for seed in range(EPISODES):
            venv = DummyVecEnv([lambda: Monitor(made("HalfCheetah-v4"))])
            venv.seed(seed)
            episode, _ = evaluate_policy(model, venv, n_eval_episodes=1, deterministic=True, return_episode_rewards=True)
            returns += episode
    write_zoo_files(folder, ENV_ID, [("policy", "MlpPolicy")])
    results = {"mean_reward": float(np.mean(returns)), "std_reward": float(np.std(returns)), "is_deterministic": True}
    (folder / "results.json").write_text(json.dumps({**results, "n_eval_episodes": EPISODES}))
    return folder / f"{ENV_ID}.zip", float(np.mean(returns))


@pytest.mark.slow
def test_an_agent_saved_on_halfcheetah_v3_sweeps_with_episodes_on_v4(
    cheetah: tuple[Path, float], ray_head: Head, tmp_path: Path
) -> None:
    zip_path, published = cheetah
    # Episodes at batch 1, as SB3's evaluate_policy plays them: in lockstep the CPU computes a row
    # inside a batch of 2 to other last bits than alone, and HalfCheetah grows a 1e-6 difference in
    # an action into a return 45% apart within 1000 steps (measured here).
    args = ("--policy", str(zip_path), "--dtypes", "float32", "--batch-sizes", "1", "--episodes", str(EPISODES))
    args = (*args, "--episode-batching", "single")
    proc = harness(
        "sweep",
        *args,
        "--cards",
        "2",
        "--accelerator",
        "cpu",
        "--no-progress",
        "--address",
        ray_head.address,
        "--results",
        str(tmp_path),
        env=ray_head.env,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = read_table(tmp_path, "runs").to_pylist()
    [recorded] = json.loads(run["policies"])
    assert (recorded["env_id"], recorded["env_renamed_from"]) == ("HalfCheetah-v4", ENV_ID)
    assert recorded["env_source"].startswith(f"RL Zoo {ENV_ID}/args.yml: {ENV_ID} is HalfCheetah-v4 since gymnasium 1.0.0")
    assert json.loads(run["summary"])["env_renames"] == {str(zip_path): recorded["env_source"]}
    assert f"renamed environment for {zip_path}: RL Zoo {ENV_ID}/args.yml" in proc.stdout
    episodes = read_table(tmp_path, "episodes").to_pylist()
    assert {e["env_id"] for e in episodes} == {"HalfCheetah-v4"} and {e["length"] for e in episodes} == {1000}
    assert {(e["mode"], e["device"]) for e in episodes} == {
        (mode, device) for mode in ("deterministic", "stochastic") for device in ("cpu", "sim-cpu0", "sim-cpu1", HONEST)
    }
    checks = read_table(tmp_path, "checks").to_pylist()
    trajectories = [c for c in checks if c["kind"] == "cross_card" and c["output"] == "actions"]
    assert trajectories and all(c["passed"] for c in trajectories), "MuJoCo episodes agree bit for bit across cards"
    [row] = [c for c in checks if c["kind"] == "published_return"]
    assert (row["device_b"], row["n_elements"], row["return_b"]) == ("published", EPISODES, published)
    assert recorded["published_return"]["source"].startswith("results.json: mean_reward")
    # The harness replays HalfCheetah-v4 as SB3's evaluate_policy did: the same seeds, the same score.
    assert row["return_a"] == pytest.approx(published, abs=1e-5), (row["return_a"], published)
    # The published mean itself, but two varying episodes: an interval far wider than the margin, never a pass.
    assert (row["outcome"], row["passed"], row["gating"]) == ("inconclusive", False, False)
