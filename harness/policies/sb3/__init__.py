"""Stable-Baselines3 saves, read without unpickling anything (the format is `sb3_zip.Sb3Zip`).

`archive` reads the zip and the readable fields of its `data`; `spaces` the observation and
action spaces; `layers` the weights and the building blocks every family shares (MLPs, NatureCNN,
CombinedExtractor); `save` what a family is handed and what it gives back. Then one module per
policy family, each a `build(save) -> Actor`: `actor_critic` (PPO, A2C, TRPO), `q_networks`
(DQN, QR-DQN), `td3` (TD3, DDPG), `sac` (SAC, TQC), `ars` (ARS). Which family reads which policy
class is one table, `sb3_zip.FAMILIES`.
"""
