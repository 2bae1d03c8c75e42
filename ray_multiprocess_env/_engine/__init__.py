"""The private engine under the three faces: options, worker pool, fan-out and transports.

See docs/architecture.md. Nothing here is public API.
"""

from __future__ import annotations

from ray_multiprocess_env._engine.fanout import Engine
from ray_multiprocess_env._engine.options import Options
from ray_multiprocess_env._engine.pool import Pool
from ray_multiprocess_env._engine.state import Call

__all__ = ["Call", "Engine", "Options", "Pool"]
