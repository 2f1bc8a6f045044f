"""Environment ids that gymnasium renamed, and what each is called now: one table.

A policy's files name the environment it was trained and published on, often under the id of
its time: the RL Zoo's agents say `LunarLander-v2`, which gymnasium 1.0 made `LunarLander-v3`.
Only a new version of the same task is mapped, one where the new version computes what the old
one did for the policy (a fixed bug in a reset, bounds declared wider, an option added and off
by default). A version that changed the task is not (BipedalWalker-v2 to v3 reads its lidar
otherwise; Acrobot-v0 to v1 observes other quantities): such an id is refused with gymnasium's
own hint (harness/envs/spec.py), and the config's `[envs]` plays the new one on purpose.

MuJoCo's -v2 and -v3 ids, on which most published continuous-control agents were trained,
need mujoco-py: gymnasium 1.x registers them only to refuse them ("moved to the
gymnasium-robotics project"). Each is mapped to its -v4, the same model and reward through the
`mujoco` bindings (the `mujoco` extra), made as mujoco-py 2.x made the old id: with the keyword
arguments that give the old observation (Ant's 111), and where a -v4 computes what mujoco-py 2.x
did not, with the keyword arguments or the wrapper (harness/envs/versions.py) that undo it: the
contact forces, zero under mujoco-py 2.x in Ant's, Humanoid's and HumanoidStandup's observations
and costs. The old ids' spaces are recorded here, as gym's sources made them, and
tests/test_mujoco.py makes each new id and checks it gives them, and the contact forces and costs
as mujoco-py 2.x gave them. Every difference gymnasium documents between the old id and -v4 is
said with each (gymnasium's v5 docstrings keep the version history), and the published score
(`published_return`) says whether the agent still plays there. Pusher-v2 is not mapped: Pusher-v4
runs only on mujoco < 3, and v5 made the pushed object denser.

Every mapping is said where it is used: in `runs.policies` (`env_source`) and once in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.policies.policy_files import EnvSetup, Kwargs, Wrapper


@dataclass(frozen=True)
class Spaces:
    """An id's observation shape and its Box of actions, symmetric bounds, as its old version made them."""

    observation: tuple[int, ...]
    actions: int
    action_bound: float


@dataclass(frozen=True)
class Rename:
    env_id: str  # what gymnasium calls it now
    since: str  # the release that renamed it
    change: str  # what changed, and why it is still the task the policy played
    kwargs: Kwargs = ()  # what makes the new id compute the old one's observation
    spaces: Spaces | None = None  # the old id's, which the new one must give (recorded where the old one cannot be made)
    wrappers: tuple[Wrapper, ...] = ()  # EnvironmentVersions that make it compute what the old one did

    def describe(self, old: str) -> str:
        made = f" with {', '.join(f'{k}={v!r}' for k, v in self.kwargs)}" if self.kwargs else ""
        wrapped = f" in {', '.join(w.describe() for w in self.wrappers)}" if self.wrappers else ""
        return f"{old} is {self.env_id}{made}{wrapped} since {self.since} ({self.change})"

    def setup(self, setup: EnvSetup) -> EnvSetup:
        """`setup` (the policy's files') with this rename's keyword arguments first (the files'
        win) and its wrappers first, right around the environment as they are part of it."""
        files = dict(setup.kwargs)
        kwargs = (*((k, v) for k, v in self.kwargs if k not in files), *setup.kwargs)
        return replace(setup, kwargs=kwargs, wrappers=(*self.wrappers, *setup.wrappers))


_LUNAR_V3 = (
    "wind and turbulence now reset with each episode, the world is fully destroyed between episodes and the "
    "observation bounds are declared wider; the dynamics and rewards are v2's"
)
_CAR_RACING_V3 = "finishing the lap now terminates the episode instead of truncating it; the track and rewards are unchanged"

_V4 = (
    "gymnasium-robotics took the mujoco-py ids; v4 runs the same model and reward through the mujoco bindings, so "
    "the physics agree to rounding, not bit for bit"
)
# What gymnasium documents between v3 and v4 (its v5 docstrings keep the version history), each
# checked against gym's v3 sources: v3 only added keyword arguments to v2, and v4 "now uses the
# mujoco bindings", the same defaults, observation and reward, save what is said with each.
_XML = "v4 takes no xml_file argument, which v3 did (v5 restored it)"
_HEALTHY = "v4 still gives the healthy reward on every step, as v3 did (v5 gives it only when healthy)"
# mujoco-py 2.x, which most -v3 agents trained with (gym 0.15 and later), never computed the
# contact forces: they were zero in every observation and cost (openai/gym#1541; mujoco-py 1.50,
# which gym required before, computed them). The mujoco bindings compute them.
_MUJOCO_PY2 = "contact forces, which mujoco-py 2.x left at zero (openai/gym#1541) and the mujoco bindings compute"
_NO_V3 = "no v3 release; v4 observes and rewards as v2 did"


def _mujoco(new: str, spaces: Spaces, more: str, kwargs: Kwargs = (), wrappers: tuple[Wrapper, ...] = ()) -> Rename:
    return Rename(new, "gymnasium 1.0.0", f"{_V4}; {more}", kwargs, spaces, wrappers)


def _contacts(contact_reward: str = "") -> tuple[Wrapper, ...]:
    """mujoco-py 2.x's zero contact forces, for a -v4 whose observation ends with them."""
    kwargs: Kwargs = (("contact_reward", contact_reward),) if contact_reward else ()
    return (Wrapper("harness.envs.versions.MujocoPy2Contacts", kwargs),)


_HALF_CHEETAH = _mujoco("HalfCheetah-v4", Spaces((17,), 6, 1.0), f"{_XML}; no contact forces in its observation or reward")
_HOPPER = _mujoco("Hopper-v4", Spaces((11,), 3, 1.0), f"{_XML}; {_HEALTHY}; no contact forces in its observation or reward")
_WALKER = _mujoco(
    "Walker2d-v4",
    Spaces((17,), 6, 1.0),
    f"{_XML}; {_HEALTHY}; its feet keep their unequal friction (0.9 and 1.9, made equal in v5); "
    "no contact forces in its observation or reward",
)
_SWIMMER = _mujoco("Swimmer-v4", Spaces((8,), 2, 1.0), f"{_XML}; no contact forces in its observation or reward")
_ANT = _mujoco(
    "Ant-v4",
    Spaces((111,), 8, 1.0),
    "v4 observes 27 values unless use_contact_forces=True, which restores v3's 111 and its contact cost "
    f"(5e-4 times the sum of the squared contact forces clipped to [-1, 1]); its 84 {_MUJOCO_PY2}: "
    f"contact_force_range=(0.0, 0.0) clips them to zero, in the observation and the cost, as they were; {_HEALTHY}",
    (("use_contact_forces", True), ("contact_force_range", (0.0, 0.0))),
)
_HUMANOID = _mujoco(
    "Humanoid-v4",
    Spaces((376,), 17, 0.4),
    f"its last 84 observations are {_MUJOCO_PY2}: MujocoPy2Contacts zeroes them, as they were; v4 dropped v3's "
    "contact cost from the reward, which was zero under mujoco-py 2.x, so the reward is v3's; "
    f"{_XML}, nor v3's contact_cost_weight and contact_cost_range; {_HEALTHY}; gym 0.21 changed the model slightly, "
    "and v4 has the new one",
    wrappers=_contacts(),
)
_HUMANOID_STANDUP = _mujoco(
    "HumanoidStandup-v4",
    Spaces((376,), 17, 0.4),
    f"{_NO_V3}; its last 84 observations, and its impact cost (0.5e-6 times their sum of squares, at most 10), "
    f"are {_MUJOCO_PY2}: MujocoPy2Contacts zeroes them and gives the reward without the impact cost, as it was",
    wrappers=_contacts("reward_impact"),
)

MUJOCO: dict[str, Rename] = {
    "HalfCheetah-v2": _HALF_CHEETAH,
    "HalfCheetah-v3": _HALF_CHEETAH,
    "Hopper-v2": _HOPPER,
    "Hopper-v3": _HOPPER,
    "Walker2d-v2": _WALKER,
    "Walker2d-v3": _WALKER,
    "Swimmer-v2": _SWIMMER,
    "Swimmer-v3": _SWIMMER,
    "Ant-v2": _ANT,
    "Ant-v3": _ANT,
    "Humanoid-v2": _HUMANOID,
    "Humanoid-v3": _HUMANOID,
    "HumanoidStandup-v2": _HUMANOID_STANDUP,
    "Reacher-v2": _mujoco("Reacher-v4", Spaces((11,), 2, 1.0), f"{_NO_V3}; no contact forces in its observation or reward"),
    "InvertedPendulum-v2": _mujoco(
        "InvertedPendulum-v4", Spaces((4,), 1, 3.0), f"{_NO_V3}; no contact forces in its observation or reward"
    ),
    "InvertedDoublePendulum-v2": _mujoco(
        "InvertedDoublePendulum-v4",
        Spaces((11,), 1, 1.0),
        f"{_NO_V3}; its last 3 observations (qfrc_constraint) read zero in both, as gymnasium documents",
    ),
}
"""MuJoCo's -v2 and -v3, which gymnasium 1.x registers only to refuse them."""

RENAMES: dict[str, Rename] = {
    "LunarLander-v2": Rename("LunarLander-v3", "gymnasium 1.0.0", _LUNAR_V3),
    # gymnasium 1.4 still registers the continuous variant under its own name, as LunarLander-v3 with
    # continuous=True: the same environment.
    "LunarLanderContinuous-v2": Rename("LunarLanderContinuous-v3", "gymnasium 1.0.0", _LUNAR_V3),
    "CarRacing-v1": Rename("CarRacing-v3", "gymnasium 1.0.0", _CAR_RACING_V3),
    "CarRacing-v2": Rename("CarRacing-v3", "gymnasium 1.0.0", _CAR_RACING_V3),
    "Pendulum-v0": Rename("Pendulum-v1", "gym 0.21.0", "the equations were simplified, with no difference in behaviour"),
    "Taxi-v3": Rename(
        "Taxi-v4", "gymnasium 1.3.0", "only the is_rainy and fickle_passenger variants changed, and both are off by default"
    ),
    **MUJOCO,
}


def renamed(env_id: str) -> Rename | None:
    """What gymnasium calls `env_id` now, where it renamed it."""
    return RENAMES.get(env_id)
