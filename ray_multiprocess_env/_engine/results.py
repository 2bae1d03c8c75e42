"""What the engine hands to its faces: a `Batch` per call, the envs' spec, each worker.

Not the workers' status records (`_protocol.status`): these are what the verbs return.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

__all__ = ["Batch", "EngineSpec", "WorkerInfo"]


@dataclasses.dataclass(frozen=True)
class EngineSpec:
    """The envs of an engine: how many, their spaces, metadata and render mode.

    The spaces are None for a pool of the user's own actors (they are not asked at start), and
    `uniform` says whether every env's spaces fit one layout (then batches have it): the same
    spaces, or with gymnasium's ``observation_mode="different"`` observations of one shape.
    """

    num_envs: int
    observation_space: Any = None
    action_space: Any = None
    metadata: dict[str, Any] = dataclasses.field(default_factory=dict)
    render_mode: str | None = None
    uniform: bool = False
    #: Each env's observation space (empty for the user's own actors).
    observation_spaces: tuple[Any, ...] = ()


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """One worker as the faces may show it: its actor, its envs, its node."""

    actor: Any
    envs: range
    node_id: str | None


@dataclasses.dataclass
class Batch:
    """The results of one `reset`, `step` or `recv`, for all envs or for `env_ids`.

    Attributes:
        observations: The batched observations (gymnasium's layout of the single space).
        rewards: float64, one per row.
        terminations: bool, one per row.
        truncations: bool, one per row.
        infos: gymnasium's batched info dict, or a list with an info dict per row (the
            engine's info layout).
        env_ids: The env of each row, ascending (a first-ready `recv`); None: row i is env i.
        old_api: An env spoke old gym's API (``reset`` gave only the observation, ``step``
            four items): the terminations are its ``done``.
        shared: The arrays are the engine's own (shared memory), overwritten by the next call:
            copy what is kept.
        rows: For envs that are the user's own actors: what each env returned, as it returned
            it (the other fields are then None).
    """

    observations: Any
    rewards: np.ndarray | None
    terminations: np.ndarray | None
    truncations: np.ndarray | None
    infos: Any
    env_ids: np.ndarray | None = None
    old_api: bool = False
    shared: bool = False
    rows: list[Any] | None = None

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rewards, terminations and truncations (of a batch with a layout, not `rows`)."""
        if self.rewards is None or self.terminations is None or self.truncations is None:
            raise TypeError("a batch of the envs' own results has no arrays")
        return self.rewards, self.terminations, self.truncations
