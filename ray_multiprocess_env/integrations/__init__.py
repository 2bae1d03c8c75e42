"""Adapters between Ray vector envs and RL libraries (pfrl; more to come).

Each adapter imports its library lazily, so importing `ray_multiprocess_env` never imports torch,
pfrl or stable-baselines3.
"""

from __future__ import annotations

from ray_multiprocess_env.integrations.pfrl import GymAPIBridge

__all__ = ["GymAPIBridge"]
