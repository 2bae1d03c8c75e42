"""The constructors of `RayVectorEnv` that start its actors: `from_env_fns`, `from_remote_class`.

`RayVectorEnv` holds them as class methods (``from_env_fns = classmethod(from_env_fns)``); they
are written here, as functions of the class they build, to keep `pfrl.py` one readable class.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import ray
from gymnasium.vector import AutoresetMode
from ray.actor import ActorHandle

from ray_multiprocess_env._engine import Engine, Options
from ray_multiprocess_env._engine.options import check_positive_int, envs_per_worker_argument
from ray_multiprocess_env.placement import plan_placement

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ray_multiprocess_env.faces.pfrl import RayVectorEnv
    from ray_multiprocess_env.options import WorkerOptions


__all__ = ["check_actors", "from_env_fns", "from_remote_class"]


def from_env_fns(
    cls: type[RayVectorEnv],
    /,
    env_fns: Sequence[Callable[[], Any]],
    *,
    envs_per_worker: int | None = None,
    envs_per_actor: int | None = None,
    autoreset_mode: str | AutoresetMode = "next_step",
    check_actions: bool = False,
    seed: int | np.random.SeedSequence | Sequence[int | None] | None = None,
    copy: bool = True,
    **options: Unpack[WorkerOptions],
) -> RayVectorEnv:
    """Build the envs from factories inside worker actors holding `envs_per_worker` each.

    The result behaves exactly like a `RayVectorEnv` over one actor per env (same return
    values, masks, seeds and errors), but each remote call steps a whole worker's envs,
    which is much faster for cheap envs. `remote_envs` are then the worker actors.

    Args:
        cls: The class it builds: `RayVectorEnv`, or the subclass it is called on.
        env_fns: One picklable factory per env, called once inside its worker.
        envs_per_worker: How many envs each worker holds (the last may hold fewer; 1 if
            None).
        envs_per_actor: The deprecated name of `envs_per_worker`.
        autoreset_mode: Checked, and otherwise unused: a `RayVectorEnv` never resets an
            env by itself (pfrl resets finished envs with `reset(mask)`); accepted so that
            every entry point takes the same options.
        check_actions: As for the constructor.
        seed: As `seed` called right after construction.
        copy: With True (default) each observation handed out is an array of its own; with
            False, when the workers share memory with the driver, a row of the shared batch
            that the next `step` or `reset` overwrites.
        **options: `WorkerOptions` (``actor_options``, ``placement``, ``timeout``,
            ``on_actor_failure``, ``transport``, ``on_env_error``, ``max_restarts``). An
            env lost to a restart or rebuilt after an error reports its episode as cut
            short at its next ``step``: gymnasium envs as truncated, old-gym envs as not
            done with ``info["needs_reset"] = True``.

    Example:
        >>> import gymnasium as gym
        >>> from ray_multiprocess_env import RayVectorEnv
        >>> fns = [lambda: gym.make("CartPole-v1") for _ in range(4)]
        >>> with RayVectorEnv.from_env_fns(fns, envs_per_worker=2) as vec:
        ...     obs, infos = vec.reset()
        ...     print(vec.num_envs, len(vec.remote_envs))
        4 2
    """
    per_worker = envs_per_worker_argument(envs_per_worker, envs_per_actor)
    checked = Options.make(
        options,
        where=f"{cls.__name__}.from_env_fns",
        own=from_env_fns,
        autoreset_mode=autoreset_mode,
        check_actions=check_actions,
    )
    if not isinstance(copy, bool):
        raise TypeError(f"`copy` must be True or False, got {copy!r}.")
    vec = cls.__new__(cls)
    engine = Engine.start(
        env_fns,
        per_worker,
        checked,
        name=cls.__name__,
        uniform="prefer",
        autoreset=False,
    )
    vec._setup(engine, checked, copy=copy)
    if seed is not None:
        try:
            vec.seed(seed)
        except BaseException as error:
            vec._engine.abort(error)
            raise
    return vec


def from_remote_class(
    cls: type[RayVectorEnv],
    /,
    actor_class: Any,
    num_envs: int,
    *,
    args: Sequence[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    placement: Any = None,
    actor_options: Mapping[str, Any] | None = None,
    timeout: float | None = None,
    check_actions: bool = False,
) -> RayVectorEnv:
    """Create `num_envs` actors of `actor_class` where `placement` says, as one vector env.

    The same as ``RayVectorEnv([actor_class.options(...).remote(*args, **kwargs) ...])``
    with each actor's options planned by `plan_placement`; a placement group made here is
    removed by `close`.

    Args:
        cls: The class it builds: `RayVectorEnv`, or the subclass it is called on.
        actor_class: A Ray actor class, e.g. one made by `make_remote_class`.
        num_envs: How many actors (one env each).
        args: Positional arguments of every actor's ``__init__``.
        kwargs: Keyword arguments of every actor's ``__init__``.
        placement: As for `from_env_fns`.
        actor_options: Extra ``.options(...)`` of every actor (``num_cpus``, ...).
        timeout: As for the constructor.
        check_actions: As for the constructor.

    Example:
        >>> import gymnasium as gym
        >>> from ray_multiprocess_env import RayVectorEnv, make_remote_class
        >>> class Holder:  # one env of the id it is given
        ...     def __init__(self, env_id, **env_kwargs):
        ...         self.env = gym.make(env_id, **env_kwargs)
        >>> RemoteHolder = make_remote_class(Holder, "env", gym.Env)
        >>> pendulums = {"args": ("Pendulum-v1",), "placement": "SPREAD"}
        >>> with RayVectorEnv.from_remote_class(RemoteHolder, 2, **pendulums) as vec:
        ...     print(vec.num_envs, len(set(vec.node_ids())), vec.action_space.shape)
        2 1 (1,)
    """
    if not hasattr(actor_class, "options") or not hasattr(actor_class, "remote"):
        raise TypeError(
            f"`actor_class` must be a Ray actor class (with `.options` and `.remote`), got "
            f"{actor_class!r}; make one with `make_remote_class` or `ray.remote`."
        )
    count = check_positive_int("num_envs", num_envs)
    given = {"timeout": timeout, "actor_options": actor_options, "placement": placement}
    options = Options.make({**given, "transport": "ray"}, check_actions=check_actions)
    plan = plan_placement(placement, count, actor_options, timeout=timeout)
    actors = []
    try:
        for index in range(count):
            created = actor_class.options(**plan.options(index))
            actors.append(created.remote(*args, **dict(kwargs or {})))
        engine = Engine.of_actors(actors, options, name=cls.__name__, plan=plan)
    except BaseException:
        for actor in actors:
            ray.kill(actor)
        plan.release()
        raise
    vec = cls.__new__(cls)
    vec._setup(engine, options)
    return vec


def check_actors(actors: Any) -> list[ActorHandle[Any]]:
    """The constructor's `actors` as a list of actor handles, or an error naming the bad one."""
    if isinstance(actors, (str, bytes)) or not isinstance(actors, Iterable):
        raise TypeError(
            f"`actors` must be a list of Ray actor handles, got {actors!r}; "
            "e.g. `RayVectorEnv([RemoteEnv.remote() for _ in range(8)])`."
        )
    handles: list[ActorHandle[Any]] = list(actors)
    if not handles:
        raise ValueError("`actors` is empty; pass at least one Ray actor handle.")
    for index, actor in enumerate(handles):
        if not isinstance(actor, ActorHandle):
            raise TypeError(
                f"`actors[{index}]` must be a Ray actor handle, got {actor!r} "
                f"({type(actor).__name__}); create it with `.remote()` on a Ray actor class."
            )
    return handles
