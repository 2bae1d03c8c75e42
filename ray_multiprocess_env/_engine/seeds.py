"""Seed bookkeeping: the seeds kept for each env's next reset, its last seed, restart seeds.

An int seed gives env ``i`` the seed ``seed + i`` (the faces turn it into one per env);
`RayVectorEnv.seed` keeps a seed for an env without a ``seed`` method until its next reset; a
restarted env is reset with a seed derived from its last one and its restart count, so a
seeded run stays reproducible through crashes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ray_multiprocess_env.compat import restart_seed

__all__ = ["SeedBook", "restart_seed"]


class SeedBook:
    """The seeds of `num_envs` envs (see the module docstring)."""

    def __init__(self, num_envs: int) -> None:
        self.last: list[int | None] = [None] * num_envs
        self._kept: list[int | None] = [None] * num_envs
        self._restarts = [0] * num_envs

    def keep(self, env: int, seed: int | None) -> None:
        """Keep `seed` for env `env`'s next reset."""
        self._kept[env] = seed

    def for_reset(
        self, seeds: Sequence[int | None] | None, envs: Iterable[int]
    ) -> list[int | None]:
        """The seed of each env for a reset of `envs`: the one given, else the one kept.

        Nothing is used up until `sent` says the reset was sent.
        """
        out: list[int | None] = [None] * len(self.last) if seeds is None else list(seeds)
        for env in envs:
            if out[env] is None:
                out[env] = self._kept[env]
        return out

    def sent(self, seeds: Sequence[int | None], envs: Iterable[int]) -> None:
        """A reset of `envs` with `seeds` (`for_reset`'s) was sent: their kept seeds are used up.

        The seed given to each of `envs` becomes its last (an env the reset left out keeps
        its own: a later restart derives its seed from a seed that env used).
        """
        last, kept = self.last, self._kept
        for env in envs:
            kept[env] = None
            seed = seeds[env]
            if seed is not None:
                last[env] = seed

    def note(self, seeds: Sequence[int | None]) -> None:
        """Remember each env's last seed."""
        for env, seed in enumerate(seeds):
            if seed is not None:
                self.last[env] = seed

    def for_restart(self, envs: Iterable[int]) -> list[int | None]:
        """The seeds of `envs` restarted once more."""
        out = []
        for env in envs:
            self._restarts[env] += 1
            out.append(restart_seed(self.last[env], self._restarts[env]))
        return out
