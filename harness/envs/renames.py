"""Environment ids that gymnasium renamed, and what each is called now: one table.

A policy's files name the environment it was trained and published on, often under the id of
its time: the RL Zoo's agents say `LunarLander-v2`, which gymnasium 1.0 made `LunarLander-v3`.
Only a new version of the same task is mapped, one where the new version computes what the old
one did for the policy (a fixed bug in a reset, bounds declared wider, an option added and off
by default). A version that changed the task is not (BipedalWalker-v2 to v3 reads its lidar
otherwise; Acrobot-v0 to v1 observes other quantities): such an id is refused with gymnasium's
own hint (harness/envs/spec.py), and the config's `[envs]` plays the new one on purpose.

Every mapping is said where it is used: in `runs.policies` (`env_source`) and once in the summary.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Rename:
    env_id: str  # what gymnasium calls it now
    since: str  # the release that renamed it
    change: str  # what changed, and why it is still the task the policy played

    def describe(self, old: str) -> str:
        return f"{old} is {self.env_id} since {self.since} ({self.change})"


_LUNAR_V3 = (
    "wind and turbulence now reset with each episode, the world is fully destroyed between episodes and the "
    "observation bounds are declared wider; the dynamics and rewards are v2's"
)
_CAR_RACING_V3 = "finishing the lap now terminates the episode instead of truncating it; the track and rewards are unchanged"

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
}


def renamed(env_id: str) -> Rename | None:
    """What gymnasium calls `env_id` now, where it renamed it."""
    return RENAMES.get(env_id)
