"""What builds gymnasium vector envs: `make_vector_env`, and `vector_entry_point` for `make_vec`."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from ray_multiprocess_env.env_factories import made_from
from ray_multiprocess_env.faces.gymnasium import GymnasiumVectorEnv
from ray_multiprocess_env.options import MAKE_KEYS, did_you_mean, own_keywords
from ray_multiprocess_env.runtime import ray_cpus

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.options import MakeOptions

__all__ = ["make_vector_env", "vector_entry_point"]


def make_vector_env(
    env: str | Callable[..., gym.Env[Any, Any]] | None = None,
    num_envs: int | None = None,
    *legacy: int,
    seed: int | np.random.SeedSequence | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    check_actions: bool = False,
    copy: bool = True,
    observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
    make_env: Callable[[int], gym.Env[Any, Any]] | None = None,
    **options: Unpack[MakeOptions],
) -> GymnasiumVectorEnv:
    """Envs in Ray workers as one gymnasium vector env: ``make_vector_env("CartPole-v1", 8)``.

    Args:
        env: A gymnasium id, made in each worker with ``gymnasium.make(env, **env_kwargs)``; or
            a picklable factory, called in the worker with the env's global index
            ``0..num_envs-1`` if it has a required positional parameter
            (``lambda index: ...``), else with no argument (``lambda: ...``, an env class).
        num_envs: How many envs. Alone, the workers default to the CPUs Ray offers (on a local
            runtime, the machine's cores) and `envs_per_worker` is derived.
        seed: If given, env ``i`` is seeded ``seed + i`` at the first `reset` (no two envs
            share a seed); a `numpy.random.SeedSequence` gives env ``i`` the seed
            ``int(seq.spawn(num_envs)[i].generate_state(1)[0])``: runs with different base
            seeds then share no env seed (``seed + i`` overlaps between runs).
        autoreset_mode: ``"next_step"``, ``"same_step"`` or ``"disabled"``.
        check_actions: As for `GymnasiumVectorEnv`.
        copy: As for `GymnasiumVectorEnv` (False: observations are read-only views of the
            shared memory, valid until the next call).
        observation_mode: gymnasium's: ``"same"``, ``"different"`` (observation spaces of one
            shape and dtype, their bounds may differ) or a ``(batched, single)`` pair of
            spaces, as for `GymnasiumVectorEnv`.
        *legacy: Only for the old positional form ``make_vector_env(make_env, num_workers,
            envs_per_worker)``, which works with a `DeprecationWarning`.
        make_env: The old name of `env` (deprecated).
        **options: `MakeOptions`: the counts ``num_workers`` and ``envs_per_worker``,
            ``env_kwargs``, ``wrappers``, and the `WorkerOptions` (``actor_options``,
            ``placement``, ``timeout``, ``on_actor_failure``, ``transport``,
            ``on_env_error``, ``max_restarts``).

    Raises:
        TypeError: A bad `env`, `env_kwargs`, `wrappers` or count type, or an unknown option,
            named with the fix.
        ValueError: An unknown id, or counts missing, not positive or inconsistent (named).

    Example:
        >>> envs = make_vector_env("CartPole-v1", 6, num_workers=2, seed=0)
        >>> obs, infos = envs.reset()
        >>> obs.shape, envs.num_envs
        ((6, 4), 6)
        >>> envs.close()
    """
    env_fns, layout, worker = made_from(
        make_vector_env, env, num_envs, options, cpus=ray_cpus, legacy=legacy, make_env=make_env
    )
    return GymnasiumVectorEnv(
        env_fns,
        envs_per_worker=layout,
        autoreset_mode=autoreset_mode,
        seed=seed,
        check_actions=check_actions,
        copy=copy,
        observation_mode=observation_mode,
        **worker,
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
    seed: int | np.random.SeedSequence | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    check_actions: bool = False,
    copy: bool = True,
    observation_mode: str | tuple[gym.Space[Any], gym.Space[Any]] = "same",
    **arguments: Any,
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
        seed: As for `make_vector_env`.
        autoreset_mode: As for `make_vector_env`.
        check_actions: As for `make_vector_env`.
        copy: As for `make_vector_env`.
        observation_mode: As for `make_vector_env`.
        **arguments: `MakeOptions` (as for `make_vector_env`: ``num_workers``,
            ``envs_per_worker``, ``wrappers``, ``actor_options``, ``timeout``, ...), and
            ``gymnasium.make``'s own ``max_episode_steps``, ``render_mode`` and
            ``disable_env_checker`` (``gymnasium.make_vec`` passes them at the top level).

    Raises:
        TypeError: For any other top-level key, on the driver before any worker starts,
            naming the key and the accepted ones.
    """
    make_arguments = {k: arguments.pop(k) for k in _MAKE_ARGUMENTS if k in arguments}
    unknown = sorted(set(arguments) - MAKE_KEYS)
    if unknown:
        accepted = sorted([*MAKE_KEYS, *own_keywords(vector_entry_point), *_MAKE_ARGUMENTS])
        raise TypeError(
            f"`vector_entry_point` got unknown argument(s) {unknown}."
            f"{did_you_mean(unknown[0], accepted)} Env arguments go in `env_kwargs` (e.g. "
            f"kwargs={{'env_id': ..., 'env_kwargs': {{...}}}}). Accepted: {', '.join(accepted)}."
        )
    return make_vector_env(
        env_id,
        num_envs,
        env_kwargs={**make_arguments, **(env_kwargs or {})},
        seed=seed,
        autoreset_mode=autoreset_mode,
        check_actions=check_actions,
        copy=copy,
        observation_mode=observation_mode,
        **arguments,
    )
