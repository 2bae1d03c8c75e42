"""The private engine under the three faces: workers, calls, transports, the batch.

See docs/architecture.md. Nothing here is public API.
"""

from __future__ import annotations

from ray_multiprocess_env._engine.engine import Engine
from ray_multiprocess_env._engine.options import Options
from ray_multiprocess_env._engine.results import Batch, EngineSpec, WorkerInfo

__all__ = ["Batch", "Engine", "EngineSpec", "Options", "WorkerInfo"]
