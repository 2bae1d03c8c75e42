"""What builds gymnasium vector envs: `make_vector_env`, and `vector_entry_point` for `make_vec`."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env._engine.options import DEFAULT_MAX_RESTARTS
from ray_multiprocess_env.env_factories import env_factories, legacy_arguments
from ray_multiprocess_env.integrations.gymnasium import GymnasiumVectorEnv
from ray_multiprocess_env.runtime import ray_cpus

__all__ = ["make_vector_env", "vector_entry_point"]

Wrapper = Callable[[gym.Env[Any, Any]], gym.Env[Any, Any]]


def make_vector_env(
    env: str | Callable[..., gym.Env[Any, Any]] | None = None,
    num_envs: int | None = None,
    *legacy: int,
    num_workers: int | None = None,
    envs_per_worker: int | None = None,
    env_kwargs: Mapping[str, Any] | None = None,
    wrappers: Sequence[Wrapper] | None = None,
    seed: int | np.random.SeedSequence | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
    check_actions: bool = False,
    copy: bool = True,
    on_env_error: str = "raise",
    max_restarts: int | None = DEFAULT_MAX_RESTARTS,
    make_env: Callable[[int], gym.Env[Any, Any]] | None = None,
) -> GymnasiumVectorEnv:
    """Envs in Ray workers as one gymnasium vector env: ``make_vector_env("CartPole-v1", 8)``.

    Args:
        env: A gymnasium id, made in each worker with ``gymnasium.make(env, **env_kwargs)``; or
            a picklable factory, called in the worker with the env's global index
            ``0..num_envs-1`` if it has a required positional parameter
            (``lambda index: ...``), else with no argument (``lambda: ...``, an env class).
        num_envs: How many envs. Alone, the workers default to the CPUs Ray offers (on a local
            runtime, the machine's cores) and `envs_per_worker` is derived.
        num_workers: How many worker actors (Ray processes).
        envs_per_worker: How many envs each worker steps per call (the last may hold fewer).
            Give any two of the three counts and the third is derived.
        env_kwargs: Keyword arguments of ``gymnasium.make`` (with an id only).
        wrappers: Callables applied in order to each env inside its worker, as
            ``gymnasium.make_vec`` does (e.g. ``[gymnasium.wrappers.RecordEpisodeStatistics]``).
        seed: If given, env ``i`` is seeded ``seed + i`` at the first `reset` (no two envs
            share a seed); a `numpy.random.SeedSequence` gives env ``i`` the seed
            ``int(seq.spawn(num_envs)[i].generate_state(1)[0])``: runs with different base
            seeds then share no env seed (``seed + i`` overlaps between runs).
        autoreset_mode: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        actor_options: Options for `ray.remote` of each worker (``num_cpus``, ...).
        placement: As for `GymnasiumVectorEnv`, e.g. ``"SPREAD"`` over a cluster's nodes.
        timeout: Seconds to wait for any one call, or None.
        on_actor_failure: ``"raise"`` or ``"restart"``, as for `GymnasiumVectorEnv`.
        transport: ``"auto"``, ``"pipe"`` or ``"ray"``, as for `GymnasiumVectorEnv`.
        check_actions: As for `GymnasiumVectorEnv`.
        copy: As for `GymnasiumVectorEnv` (False: observations are a view of shared memory).
        on_env_error: ``"raise"`` or ``"restart"``, as for `GymnasiumVectorEnv`.
        max_restarts: As for `GymnasiumVectorEnv` (default 100; None: no limit).
        *legacy: Only for the old positional form ``make_vector_env(make_env, num_workers,
            envs_per_worker)``, which works with a `DeprecationWarning`.
        make_env: The old name of `env` (deprecated).

    Raises:
        TypeError: A bad `env`, `env_kwargs`, `wrappers` or count type, named with the fix.
        ValueError: An unknown id, or counts missing, not positive or inconsistent (named).

    Example:
        >>> envs = make_vector_env("CartPole-v1", 6, num_workers=2, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape, envs.num_envs
        ((6, 4), 6)
        >>> envs.close()
    """
    env, num_envs, num_workers, envs_per_worker = legacy_arguments(
        "make_vector_env", env, num_envs, legacy, num_workers, envs_per_worker, make_env
    )
    env_fns, per_worker = env_factories(
        env, num_envs, num_workers, envs_per_worker, env_kwargs, wrappers, cpus=ray_cpus
    )
    return GymnasiumVectorEnv(
        env_fns,
        envs_per_worker=per_worker,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        seed=seed,
        on_actor_failure=on_actor_failure,
        transport=transport,
        check_actions=check_actions,
        copy=copy,
        on_env_error=on_env_error,
        max_restarts=max_restarts,
    )


#: What `vector_entry_point` passes on to ``gymnasium.make`` from the top level (its own
#: arguments, which ``gymnasium.make_vec`` may add); every other env argument goes in
#: `env_kwargs`.
_MAKE_ARGUMENTS = ("max_episode_steps", "render_mode", "disable_env_checker")


def vector_entry_point(
    num_envs: int,
    *,
    env_id: str,
    env_kwargs: Mapping[str, Any] | None = None,
    num_workers: int | None = None,
    envs_per_worker: int | None = None,
    wrappers: Sequence[Wrapper] | None = None,
    seed: int | np.random.SeedSequence | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    actor_options: Mapping[str, Any] | None = None,
    placement: Any = None,
    timeout: float | None = None,
    on_actor_failure: str = "raise",
    transport: str | None = None,
    check_actions: bool = False,
    copy: bool = True,
    on_env_error: str = "raise",
    max_restarts: int | None = DEFAULT_MAX_RESTARTS,
    **make_arguments: Any,
) -> GymnasiumVectorEnv:
    """Gymnasium's ``vector_entry_point`` for Ray vector envs of a registered env id.

    Register an id with it and `gymnasium.make_vec` returns a `GymnasiumVectorEnv`::

        gymnasium.register(
            "RayCartPole-v1",
            vector_entry_point="ray_multiprocess_env:vector_entry_point",
            kwargs={"env_id": "CartPole-v1", "envs_per_worker": 4},
        )
        envs = gymnasium.make_vec("RayCartPole-v1", num_envs=8,
                                  vectorization_mode="vector_entry_point")

    Args:
        num_envs: The number of envs (given by `gymnasium.make_vec`).
        env_id: The id of the single env, made with ``gymnasium.make(env_id, **env_kwargs)``.
        env_kwargs: Keyword arguments of ``gymnasium.make`` for each env.
        num_workers: Worker actors; with neither this nor `envs_per_worker`, the CPUs Ray offers.
        envs_per_worker: Envs per worker actor.
        wrappers: As for `make_vector_env`.
        seed: As for `GymnasiumVectorEnv`.
        autoreset_mode: As for `GymnasiumVectorEnv`.
        actor_options: As for `GymnasiumVectorEnv`.
        placement: As for `GymnasiumVectorEnv`.
        timeout: As for `GymnasiumVectorEnv`.
        on_actor_failure: As for `GymnasiumVectorEnv`.
        transport: As for `GymnasiumVectorEnv`.
        check_actions: As for `GymnasiumVectorEnv`.
        copy: As for `GymnasiumVectorEnv`.
        on_env_error: As for `GymnasiumVectorEnv`.
        max_restarts: As for `GymnasiumVectorEnv`.
        **make_arguments: Only ``gymnasium.make``'s own ``max_episode_steps``, ``render_mode``
            and ``disable_env_checker`` (``gymnasium.make_vec`` passes them at the top level).

    Raises:
        TypeError: For any other top-level key, on the driver before any worker starts,
            naming the key and the accepted ones.
    """
    unknown = sorted(set(make_arguments) - set(_MAKE_ARGUMENTS))
    if unknown:
        accepted = sorted(
            [*vector_entry_point.__kwdefaults__, "env_id", *_MAKE_ARGUMENTS]  # type: ignore[misc]
        )
        raise TypeError(
            f"`vector_entry_point` got unknown argument(s) {unknown}; env arguments go in "
            f"`env_kwargs` (e.g. kwargs={{'env_id': ..., 'env_kwargs': {{...}}}}). Accepted: "
            f"{', '.join(accepted)}."
        )
    return make_vector_env(
        env_id,
        num_envs,
        num_workers=num_workers,
        envs_per_worker=envs_per_worker,
        env_kwargs={**make_arguments, **(env_kwargs or {})},
        wrappers=wrappers,
        seed=seed,
        autoreset_mode=autoreset_mode,
        actor_options=actor_options,
        placement=placement,
        timeout=timeout,
        on_actor_failure=on_actor_failure,
        transport=transport,
        check_actions=check_actions,
        copy=copy,
        on_env_error=on_env_error,
        max_restarts=max_restarts,
    )
