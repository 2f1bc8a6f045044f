"""How an environment is found and made from a policy's files: the RL Zoo's run files (env_kwargs,
env_wrapper, frame_stack), the score a model card or results.json states, the ids gymnasium
renamed, and the wrappers a run file may name."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from dataclasses import replace
from pathlib import Path

import gymnasium as gym
import pytest
import yaml

from harness.envs.registry import check_env, env_spaces
from harness.envs.renames import MUJOCO, RENAMES
from harness.envs.spec import EnvSpec, is_registered, make_env, require_registered
from harness.errors import PolicyLoadError, UsageError
from harness.policies import CARTPOLE_ZIP, load_policy
from harness.policies.policy_files import EnvSetup, PublishedScore, Wrapper, find_env
from harness.sweeps.plan import with_gymnasium_id
from tests.test_policy_files import CARD

ATARI = "stable_baselines3.common.atari_wrappers.AtariWrapper"


def zoo_files(folder: Path, env_id: str, args: dict[str, object], config: dict[str, object]) -> Path:
    """`<env_id>.zip` with its RL Zoo run folder, the files written as the RL Zoo writes them."""
    run = folder / env_id
    run.mkdir(parents=True)
    (run / "args.yml").write_text(yaml.dump(OrderedDict([("algo", "ppo"), ("env", env_id), *args.items()])))
    (run / "config.yml").write_text(yaml.dump(OrderedDict([("policy", "MlpPolicy"), *config.items()])))
    zip_path = folder / f"{env_id}.zip"
    zip_path.write_bytes(CARTPOLE_ZIP.read_bytes())
    return zip_path


def test_run_files_say_how_the_environment_is_made(tmp_path: Path) -> None:
    config = {"env_wrapper": [ATARI, {"gymnasium.wrappers.TimeLimit": {"max_episode_steps": 50}}], "frame_stack": 4}
    policy = zoo_files(tmp_path, "LunarLander-v2", {"env_kwargs": {"enable_wind": False, "render_mode": "human"}}, config)
    found = find_env(policy)
    assert found is not None and (found.env_id, found.source) == ("LunarLander-v2", "RL Zoo LunarLander-v2/args.yml")
    assert found.setup == EnvSetup(
        kwargs=(("enable_wind", False),),  # render_mode says how a person watched, not what the policy plays
        wrappers=(Wrapper(ATARI), Wrapper("gymnasium.wrappers.TimeLimit", (("max_episode_steps", 50),))),
        frame_stack=4,
        source="LunarLander-v2/args.yml, LunarLander-v2/config.yml",
    )
    assert found.setup.describe() == (
        f"enable_wind=False; wrappers {ATARI}, gymnasium.wrappers.TimeLimit(max_episode_steps=50); frame_stack 4"
    )


def test_a_hub_repository_pushed_by_the_rl_zoo_keeps_its_run_files_beside_the_zip(tmp_path: Path) -> None:
    policy = tmp_path / "ppo-LunarLanderContinuous-v2.zip"
    policy.write_bytes(CARTPOLE_ZIP.read_bytes())
    (tmp_path / "README.md").write_text(CARD.format(tag="LunarLanderContinuous-v2", dataset="LunarLanderContinuous-v2"))
    (tmp_path / "config.yml").write_text(yaml.dump(OrderedDict([("frame_stack", 2)])))
    (tmp_path / "env_kwargs.yml").write_text(yaml.dump({"gravity": -9.0, "render_mode": "rgb_array"}))
    found = find_env(policy)
    assert found is not None and (found.env_id, found.source) == ("LunarLanderContinuous-v2", "model card README.md")
    assert (found.setup.kwargs, found.setup.frame_stack) == ((("gravity", -9.0),), 2)
    assert found.published == PublishedScore(500.0, 0.0, True, None, "model card README.md: mean_reward 500.00 +/- 0.00")
    results = {"mean_reward": 212.25, "std_reward": 31.5, "is_deterministic": False, "n_eval_episodes": 10}
    (tmp_path / "results.json").write_text(json.dumps(results))
    found = find_env(policy)
    assert found is not None
    assert found.published == PublishedScore(212.25, 31.5, False, 10, "results.json: mean_reward 212.25, std_reward 31.5")


BAD_FILES: dict[str, tuple[str, str, str]] = {
    "kwargs-a-list": ("args.yml", "env_kwargs: [1, 2]\n", "env_kwargs is [1, 2], expected a mapping"),
    "kwargs-nested": ("args.yml", "env_kwargs: {a: {b: 1}}\n", "env_kwargs a is {'b': 1}: only numbers, strings and lists"),
    "wrapper-not-a-path": ("config.yml", "env_wrapper: [[a, b]]\n", "env_wrapper ['a', 'b'] is not a class path"),
    "frame-stack-text": ("config.yml", "frame_stack: four\n", "frame_stack is 'four', expected a count of frames"),
    "vec-env-wrapper": ("config.yml", "vec_env_wrapper: a.B\n", "vec_env_wrapper 'a.B' is not replayed by this harness"),
    "card-score": ("README.md", "---\nmodel-index:\n- results:\n  - metrics:\n    - {type: mean_reward, value: good}\n---\n",
                   "model-index mean_reward is 'good', expected 'MEAN +/- STD'"),
    "results-not-json": ("results.json", "{mean_reward: 1}", "is not JSON"),
    "results-no-std": ("results.json", '{"mean_reward": 1.0}', "has no numeric mean_reward and std_reward"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_unreadable_run_files_and_scores_are_refused_in_one_line(case: str, tmp_path: Path) -> None:
    name, content, problem = BAD_FILES[case]
    policy = zoo_files(tmp_path, "CartPole-v1", {}, {})
    bad = tmp_path / ("CartPole-v1" if name.endswith(".yml") else "") / name
    if name == "args.yml":
        content = yaml.dump({"env": "CartPole-v1"}) + content
    bad.write_text(content)
    with pytest.raises(PolicyLoadError) as caught:
        find_env(policy)
    assert str(caught.value).startswith(f"{bad}: {problem}"), caught.value


def test_a_renamed_id_plays_as_gymnasium_calls_it_now_and_says_so(tmp_path: Path) -> None:
    policy = with_gymnasium_id(load_policy(str(zoo_files(tmp_path, "LunarLander-v2", {}, {}))))
    info = policy.info
    assert (info.env_id, info.env_renamed_from) == ("LunarLander-v3", "LunarLander-v2")
    assert info.env_source.startswith("RL Zoo LunarLander-v2/args.yml: LunarLander-v2 is LunarLander-v3 since gymnasium 1.0.0")
    assert with_gymnasium_id(policy).info == info, "a name gymnasium knows is left as it is"


def test_every_rename_is_from_an_id_gymnasium_refuses_to_one_it_registers(tmp_path: Path) -> None:
    """Where the installed gymnasium still registers an old id (Taxi-v3 before 1.3, as next to
    torch 2.6's SB3), the id is played as it is; otherwise gymnasium refuses it (as deprecated, or
    for MuJoCo's mujoco-py ids as moved to gymnasium-robotics) and registers the id it is mapped to."""
    for old, rename in RENAMES.items():
        policy = with_gymnasium_id(load_policy(str(zoo_files(tmp_path / old, old, {}, {}))))
        if is_registered(old):
            assert (policy.info.env_id, policy.info.env_renamed_from) == (old, ""), old
            continue
        if old in MUJOCO:
            with pytest.raises(ImportError, match="moved to the gymnasium-robotics project"):
                gym.make(old)
        else:
            with pytest.raises(gym.error.DeprecatedEnv):
                gym.spec(old)
        require_registered(rename.env_id)
        assert (policy.info.env_id, policy.info.env_renamed_from) == (rename.env_id, old)


def test_an_old_version_that_is_no_rename_is_refused_with_gymnasiums_hint() -> None:
    with pytest.raises(UsageError) as refused:
        require_registered("BipedalWalker-v2")
    message = str(refused.value)
    assert "'BipedalWalker-v2' is not registered in gymnasium" in message and "Please use `BipedalWalker-v3`" in message
    assert "not put in its place" in message and "\n" not in message


def test_box2d_and_atari_environments_are_installed() -> None:
    """The default install makes Box2D's (the box2d wheel, no swig); the atari extra ale-py's."""
    import Box2D  # noqa: F401

    for env_id in ("LunarLander-v3", "BipedalWalker-v3", "CarRacing-v3", "BreakoutNoFrameskip-v4", "ALE/Pong-v5"):
        env, _ = make_env(EnvSpec(env_id))
        env.close()


def test_only_gymnasium_wrappers_from_known_modules_are_made() -> None:
    for path in ("os.system", "tests.test_env_files.zoo_files", "collections.OrderedDict"):
        spec = EnvSpec("CartPole-v1", EnvSetup(wrappers=(Wrapper(path),)))
        with pytest.raises(UsageError, match=re.escape(f"env_wrapper {path}: wrappers are taken only from")):
            make_env(spec)
    not_a_wrapper = EnvSpec("CartPole-v1", EnvSetup(wrappers=(Wrapper("gymnasium.wrappers.vector.NormalizeReward"),)))
    with pytest.raises(UsageError, match="wrappers are taken only from"):
        make_env(not_a_wrapper)
    with pytest.raises(UsageError, match=re.escape("gymnasium.wrappers has no gymnasium Wrapper RecordConstructorArgs")):
        make_env(EnvSpec("CartPole-v1", EnvSetup(wrappers=(Wrapper("gymnasium.wrappers.RecordConstructorArgs"),))))


def test_wrappers_and_keyword_arguments_reach_the_environment() -> None:
    time_limit = Wrapper("gymnasium.wrappers.TimeLimit", (("max_episode_steps", 7),))
    limited = EnvSpec("CartPole-v1", EnvSetup(wrappers=(time_limit,)))
    env, recorder = make_env(limited)
    env.reset(seed=0)
    steps = next(t for t in range(1, 100) if any(env.step(0)[2:4]))
    assert steps <= 7 and isinstance(env, gym.wrappers.TimeLimit) and recorder.env.spec.id == "CartPole-v1"
    continuous = EnvSpec("LunarLander-v3", EnvSetup(kwargs=(("continuous", True),)))
    assert isinstance(env_spaces(continuous)[1], gym.spaces.Box)
    with pytest.raises(UsageError, match=r"environment LunarLander-v3 \[colour='red'\] cannot be made"):
        make_env(EnvSpec("LunarLander-v3", EnvSetup(kwargs=(("colour", "red"),))))


def test_an_environment_whose_observations_are_images_is_refused_for_a_vector_policy() -> None:
    cartpole = load_policy("cartpole").info
    with pytest.raises(UsageError) as refused:
        check_env("CarRacing-v3", replace(cartpole, action_kind="continuous", action_size=3))
    assert "its observations are obs (3, 96, 96) uint8, the policy takes obs (4,) float32" in str(refused.value)
