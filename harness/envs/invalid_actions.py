"""sb3-contrib's `InvalidActionEnvDiscrete`, the environment of MaskablePPO's examples, as an
episode of the harness plays it: made from its seed.

sb3-contrib's class draws each state from its action space's own generator, which `reset(seed=)`
never seeds, and its invalid actions from numpy's global one, so no two plays of a seed agree and
a card's episode could not be set beside the CPU's. This class is sb3-contrib's, with its one draw
(`_choose_next_state`) made from the environment's generator, which `reset(seed=)` seeds: the
same states and masks in distribution, the same ones for every player of a seed.

Registered (harness/envs/spec.py) as `ENV_ID`, with MaskablePPO's documented example's size
(`InvalidActionEnvDiscrete(dim=80, n_invalid_actions=60)`) by default; a run file's `env_kwargs`
give another. Made only where sb3-contrib is installed (`pip install sb3-contrib`).
"""

from __future__ import annotations

from sb3_contrib.common.envs import InvalidActionEnvDiscrete


class SeededInvalidActionEnvDiscrete(InvalidActionEnvDiscrete):
    def _choose_next_state(self) -> None:
        self.state = int(self.np_random.integers(len(self.possible_actions)))
        others = [action for action in self.possible_actions if action != self.state]
        self.invalid_actions = self.np_random.choice(others, self.n_invalid_actions, replace=False).tolist()
