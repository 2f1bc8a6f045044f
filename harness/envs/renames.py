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
`mujoco` bindings (the `mujoco` extra), made with the keyword arguments that give it the old
id's observation where it has them (Ant). The old ids' spaces are recorded here, as gym's
sources made them, and tests/test_mujoco.py makes each new id and checks it gives them. What
still differs is said with each, and the published score (`published_return`) says whether the
agent still plays there. Pusher-v2 is not mapped: Pusher-v4 runs only on mujoco < 3, and v5
made the pushed object denser.

Every mapping is said where it is used: in `runs.policies` (`env_source`) and once in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from harness.policies.policy_files import EnvSetup, Kwargs


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

    def describe(self, old: str) -> str:
        made = f" with {', '.join(f'{k}={v!r}' for k, v in self.kwargs)}" if self.kwargs else ""
        return f"{old} is {self.env_id}{made} since {self.since} ({self.change})"

    def setup(self, setup: EnvSetup) -> EnvSetup:
        """`setup` (the policy's files') with this rename's keyword arguments first; the files' win."""
        if not self.kwargs:
            return setup
        files = dict(setup.kwargs)
        return replace(setup, kwargs=(*((k, v) for k, v in self.kwargs if k not in files), *setup.kwargs))


_LUNAR_V3 = (
    "wind and turbulence now reset with each episode, the world is fully destroyed between episodes and the "
    "observation bounds are declared wider; the dynamics and rewards are v2's"
)
_CAR_RACING_V3 = "finishing the lap now terminates the episode instead of truncating it; the track and rewards are unchanged"

_V4 = (
    "gymnasium-robotics took the mujoco-py ids; v4 runs the same model and reward through the mujoco bindings, so "
    "the physics agree to rounding, not bit for bit (v3 only added keyword arguments to v2)"
)
# mujoco-py 2.x, which most -v3 agents trained with, never computed the contact forces: they were
# zero in every observation and cost (openai/gym#1541). The mujoco bindings compute them.
_CONTACT = "contact forces, which mujoco-py 2.x left at zero (openai/gym#1541) and the mujoco bindings compute"


def _mujoco(new: str, spaces: Spaces, more: str = "", kwargs: Kwargs = ()) -> Rename:
    return Rename(new, "gymnasium 1.0.0", _V4 + (f"; {more}" if more else ""), kwargs, spaces)


_HALF_CHEETAH = _mujoco("HalfCheetah-v4", Spaces((17,), 6, 1.0))
_HOPPER = _mujoco("Hopper-v4", Spaces((11,), 3, 1.0))
_WALKER = _mujoco("Walker2d-v4", Spaces((17,), 6, 1.0))
_SWIMMER = _mujoco("Swimmer-v4", Spaces((8,), 2, 1.0))
_ANT = _mujoco(
    "Ant-v4",
    Spaces((111,), 8, 1.0),
    f"use_contact_forces=True restores v3's 111 observations and its contact cost: 84 {_CONTACT}, clipped to [-1, 1]",
    (("use_contact_forces", True),),
)
_HUMANOID = _mujoco(
    "Humanoid-v4",
    Spaces((376,), 17, 0.4),
    f"its last 84 observations are {_CONTACT}; v4 dropped v3's contact cost from the reward, zero under mujoco-py 2.x",
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
    "HumanoidStandup-v2": _mujoco(
        "HumanoidStandup-v4",
        Spaces((376,), 17, 0.4),
        f"its last 84 observations, and its impact cost, are {_CONTACT}",
    ),
    "Reacher-v2": _mujoco("Reacher-v4", Spaces((11,), 2, 1.0)),
    "InvertedPendulum-v2": _mujoco("InvertedPendulum-v4", Spaces((4,), 1, 3.0)),
    "InvertedDoublePendulum-v2": _mujoco("InvertedDoublePendulum-v4", Spaces((11,), 1, 1.0)),
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
