"""What the gymnasium and SB3 faces share: info batching by row and the workers' description."""

from __future__ import annotations

from typing import Any

import numpy as np

from ray_multiprocess_env._engine import Engine

__all__ = ["add_row_info", "describe_workers"]


def describe_workers(engine: Engine) -> dict[str, Any]:
    """Spaces, metadata and render mode of the envs, checked to be the same in every worker.

    Raises:
        ValueError: If two workers' envs have different spaces (names the env).
    """
    descriptions = engine.run("describe", [()] * len(engine.bounds), "describe")
    first: dict[str, Any] = descriptions[0]
    for (start, _), description in zip(engine.bounds, descriptions, strict=True):
        for space in ("observation_space", "action_space"):
            if description[space] != first[space]:
                raise ValueError(
                    f"env {start} has {space} {description[space]} but env 0 has "
                    f"{first[space]}; every env of a vector env needs the same spaces."
                )
    return first


def add_row_info(
    infos: dict[str, Any], info: dict[str, Any], row: int, size: int
) -> dict[str, Any]:
    """Add one env's `info` at `row` of a batch of `size`, as gymnasium's ``_add_info`` does."""
    for key, value in info.items():
        if key == "final_obs":
            array = infos.get(key)
            if array is None:
                array = np.full(size, fill_value=None, dtype=object)
            array[row] = value
        elif isinstance(value, dict):
            array = add_row_info(infos.get(key, {}), value, row, size)
        else:
            array = infos.get(key)
            if array is None:
                if type(value) in (int, float, bool) or issubclass(type(value), np.number):
                    array = np.zeros(size, dtype=type(value))
                elif isinstance(value, np.ndarray):
                    array = np.zeros((size, *value.shape), dtype=value.dtype)
                else:
                    array = np.full(size, fill_value=None, dtype=object)
            array[row] = value
        mask = infos.get(f"_{key}", np.zeros(size, dtype=np.bool_))
        mask[row] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos
