"""The third-party cases beside the checkout (../shared/cases, see its README.md): where they are,
and the facts measured on them that tests compare with.

They are not ours to ship, so the repository never holds them: a test that needs their exact
bytes asks for the `cases` fixture (tests/conftest.py), which skips it where they are absent.
CI has them. What a test needs of them other than their bytes it builds (tests/builders.py).
"""

from __future__ import annotations

from pathlib import Path

from tests.helpers import REPO

CASES = REPO.parent / "shared" / "cases"
ABSENT = f"the third-party cases are absent beside the checkout ({CASES}); CI has them"

# The RL Zoo's published agents in its own layout: <algo>/<Env>_1/<Env>.zip, the run files in
# <algo>/<Env>_1/<Env>/; benchmark.tsv beside them, each agent's published score.
RLZOO = CASES / "rlzoo"
RLZOO_AGENTS = sorted(str(p.relative_to(RLZOO).parent) for p in RLZOO.glob("*/*_1/*.zip"))
"""`<algo>/<Env>_1` of each agent (none where the cases are absent)."""


def rlzoo_zip(agent: str) -> Path:
    """`<algo>/<Env>_1` -> its `<algo>/<Env>_1/<Env>.zip`."""
    folder = RLZOO / agent
    return folder / f"{folder.name.removesuffix('_1')}.zip"


# The RL Zoo's PPO CartPole-v1, saved by SB3 1.0rc0 (DLR-RM/rl-trained-agents).
ZOO_ZIP = "sb3-ppo-CartPole-v1/CartPole-v1.zip"
ZOO_CONFIG = "sb3-ppo-CartPole-v1/CartPole-v1/config.yml"
ZOO_SHA256 = "83d0de1280428dbfe8b1d4db5b4ae8450e8b137759a454eed5149a7a995228c2"
# Logits by SB3 2.9.2's ActorCriticPolicy on CartPole-v1.zip.
ZOO_LOGITS = [
    ([0.0, 0.0, 0.0, 0.0], [2.3038545, -2.2997918]),
    ([0.5, 0.3, 0.1, -0.2], [-10.2276125, 10.2127905]),
    ([-0.5, -0.3, -0.1, 0.2], [12.2140160, -12.1963778]),
]

# Unity ML-Agents 3DBall, export version 3, opset 9.
BALL = "mlagents-3DBall/3DBall.onnx"
BALL_SHA256 = "496dc01d14506b635268fc62ff0d58a16be71fe3a83e47c1ac72984ce69a1864"
# deterministic_continuous_actions by onnxruntime 1.32 (CPU).
BALL_TABLE = [
    ([0.0] * 8, [-0.10264575, -0.03890847]),
    ([0.1, -0.2, 0.3, -0.4, 0.5, -0.6, 0.7, -0.8], [-0.23106180, 0.03748217]),
    ([1, 2, 3, 4, 5, 6, 7, 8], [0.32622960, -1.00000000]),
]
