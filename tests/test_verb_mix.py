"""No face can tell which transport ran its calls: each env's history is the same on every one.

A seeded random mix of verbs (`step`, `step_async`/`step_wait`, `reset` with a mask and seeds,
first-ready `send` of whole workers (rung on the lanes) and of scattered envs (sent as pickled
calls), `recv` of some and then the rest, `get_attr`) runs over each transport and over Ray
calls. Over ``"auto"``, ``"tcp"`` and ``"pipe"`` the answers are read on the lanes while all is
well and by the failures branch otherwise (an env error, a death, infos off the columns); over
``"tcp"`` and ``"pipe"`` the rows travel after the messages, not in shared memory; over
``"ray"`` every call is a Ray call. Each env's action depends only on how many it was given, so
each env's own history (what every call handed back for it) must be the same whatever the
transport and in whatever order `recv` returned the envs.

The same mix with faults: some steps make one env raise (it is rebuilt), kill one worker (it
is restarted within the call), or wait at a gate while a real SIGINT lands inside the call
(`step` and `step_wait` give the step up; `recv` leaves its results for the next `recv`), or
both: one worker dies while the other's envs wait at the gate (the call is cut before it
restarts the dead worker; the next call that reaches it does), and the lost episodes' reports
must still come, once, at a later step.
"""

from __future__ import annotations

import contextlib
import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest

from ray_multiprocess_env import GymnasiumVectorEnv
from ray_multiprocess_env._engine.lockstep import LockstepVerbs
from tests.envs import ShiftingInfoEnv
from tests.envs_faults import FaultyShiftingEnv
from tests.helpers import assert_same, transport_kinds
from tests.interrupts import Gate, interrupt_inside

NUM_ENVS, CALLS = 6, 60
KINDS = {"auto": "shared_memory", "tcp": "tcp", "pipe": "pipe", "ray": "ray"}
VERBS = ("step", "step_async", "reset", "send_all", "send_scattered", "get_attr")
# each step's or send's fault, and its chance
FAULTS = {"none": 0.55, "error": 0.2, "death": 0.07, "interrupt": 0.1, "both": 0.08}
ERROR, DEATH = 2, 3  # (`FaultyShiftingEnv`'s actions)


class Fault(NamedTuple):
    actions: dict[int, int]  # env: ERROR or DEATH
    gate: Gate | None  # where an "interrupt" (or "both") waits


def _info(infos: dict[str, Any], row: int) -> dict[str, Any]:
    """Row `row`'s entries of gymnasium's batched infos (nested dicts too; no masks)."""
    out = {}
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id" or not infos[f"_{key}"][row]:
            continue
        out[key] = _info(value, row) if isinstance(value, dict) else value[row]
    return out


class _Mix:
    """One run of the seeded mix over `transport`; `history` holds each env's results.

    With `gates` (a folder for the gates), the envs are `FaultyShiftingEnv`s and each step or
    send may carry a fault. Whatever is drawn from `rng` never depends on what the envs gave.
    """

    def __init__(self, transport: str, seed: int, gates: Path | None) -> None:
        self.transport, self.gates = transport, gates
        self.rng, self.sizes = np.random.default_rng(seed), np.random.default_rng(seed + 1000)
        self.given = np.zeros(NUM_ENVS, dtype=np.int64)  # actions each env has been given
        self.history: dict[int, list[Any]] = {env: [] for env in range(NUM_ENVS)}
        faulty = {"on_env_error": "restart", "on_actor_failure": "restart"}
        self.envs = GymnasiumVectorEnv(
            [ShiftingInfoEnv if gates is None else FaultyShiftingEnv] * NUM_ENVS,
            envs_per_worker=3,
            transport=transport,
            **({} if gates is None else faulty),
        )

    def run(self) -> dict[int, tuple[Any, ...]]:
        every = list(range(NUM_ENVS))
        with contextlib.closing(self.envs) as envs:
            assert transport_kinds(envs) == [KINDS[self.transport]] * 2
            self.record("reset", envs.reset(seed=every), every)
            for _ in range(CALLS):
                verb = VERBS[self.rng.integers(len(VERBS))]
                if verb in ("step", "step_async"):
                    self.step(verb == "step_async")
                elif verb == "reset":
                    self.reset()
                elif verb == "get_attr":
                    for env, t in enumerate(envs.get_attr("t")):
                        self.history[env].append(("t", t))
                else:
                    self.send_and_recv(verb == "send_all")
            assert transport_kinds(envs) == [KINDS[self.transport]] * 2  # (after restarts too)
        if self.gates is not None:
            late = sorted(str(p) for p in self.gates.glob(f"{self.transport}-*/timed-out-*"))
            assert not late, f"steps waited 60 s at their gate, no Ctrl-C came: {late}"
        return {env: tuple(items) for env, items in self.history.items()}

    def fault(self) -> Fault:
        """The fault of a step or send: the envs it hits, and its gate (none without gates)."""
        if self.gates is None:
            return Fault({}, None)
        kind = list(FAULTS)[self.rng.choice(len(FAULTS), p=list(FAULTS.values()))]
        env = int(self.rng.integers(NUM_ENVS))
        if kind in ("none", "error", "death"):
            return Fault({} if kind == "none" else {env: ERROR if kind == "error" else DEATH}, None)
        folder = self.gates / f"{self.transport}-{len(os.listdir(self.gates))}"
        folder.mkdir()  # (a gate of its own for this call, where the worker of `env` waits:
        # each of its envs at its next step or reset; "both": while the other worker dies)
        gated = {i: str(folder) if i // 3 == env // 3 else None for i in range(NUM_ENVS)}
        self.envs.set_attr("gate", list(gated.values()))
        return Fault({(env + 3) % NUM_ENVS: DEATH} if kind == "both" else {}, Gate(str(folder)))

    def actions(self, ids: list[int], fault: Fault) -> np.ndarray:
        picked = [fault.actions.get(env, (env + self.given[env]) % 2) for env in ids]
        self.given[ids] += 1
        return np.array(picked, dtype=np.int64)

    def record(self, kind: str, out: tuple[Any, ...], ids: list[int]) -> None:
        obs, infos = out[0], out[-1]
        for row, env in enumerate(ids):
            flags = [out[k][row].item() for k in range(1, len(out) - 1)]
            self.history[env].append((kind, obs[row].copy(), flags, _info(infos, row)))

    def step(self, separately: bool) -> None:
        """`step`, or `step_async` then `step_wait`; a SIGINT inside the wait gives it up."""
        every = list(range(NUM_ENVS))
        fault = self.fault()
        actions = self.actions(every, fault)
        if fault.gate is not None:
            if separately:
                self.envs.step_async(actions)
                out = self.cut(LockstepVerbs.step_wait, fault.gate, self.envs.step_wait)
            else:
                step = functools.partial(self.envs.step, actions)
                out = self.cut(GymnasiumVectorEnv.step, fault.gate, step)
            if out is None:
                for env in every:
                    self.history[env].append(("given up",))
            else:
                self.record("step_async" if separately else "step", out, every)
        elif separately:
            self.envs.step_async(actions)
            self.record("step_async", self.envs.step_wait(), every)
        else:
            self.record("step", self.envs.step(actions), every)

    @staticmethod
    def cut(function: Any, gate: Gate, call: Callable[[], Any]) -> Any:
        """`call()` cut by a SIGINT inside `function` once a step is in `gate` (then None).

        If no env of the gated worker steps or resets in the call (each only hands over a
        lost episode's report), nothing enters the gate: the call returns as usual, on every
        road alike.
        """
        try:
            with interrupt_inside(function, gate):
                out = call()
        except KeyboardInterrupt:
            return None
        finally:
            gate.open()
        assert gate.entered() == 0, f"the call returned while a step was in the gate {gate}"
        return out

    def reset(self) -> None:
        mask = self.rng.random(NUM_ENVS) < 0.5
        mask[self.rng.integers(NUM_ENVS)] = True  # (at least one env)
        seeds = [int(s) for s in self.rng.integers(1000, size=NUM_ENVS)]
        out = self.envs.reset(seed=seeds, options={"reset_mask": mask})
        ids = np.flatnonzero(mask).tolist()
        self.record("reset", (out[0][mask], {k: _rows(v, mask) for k, v in out[1].items()}), ids)

    def send_and_recv(self, whole_workers: bool) -> None:
        """Two sends, then `recv`s until every env is back; a SIGINT may land in the first."""
        if whole_workers:
            groups = [[0, 1, 2], [3, 4, 5]]
        else:  # scattered envs: some of each worker's
            order = self.rng.permutation(NUM_ENVS).tolist()
            cut = int(self.rng.integers(1, NUM_ENVS))
            groups = [sorted(order[:cut]), sorted(order[cut:])]
        fault = self.fault()
        for group in groups:
            self.envs.send(self.actions(group, fault), group)
        waiting = set(range(NUM_ENVS))
        if fault.gate is not None:  # (a `recv` of all cannot return before the gate opens)
            recv = functools.partial(self.envs.recv, batch_size=len(waiting))
            out = self.cut(GymnasiumVectorEnv.recv, fault.gate, recv)
            if out is not None:
                ids = out[-1]["env_id"].tolist()
                waiting -= set(ids)
                self.record("recv", out, ids)
        while waiting:  # (how many a `recv` waits for: drawn apart from the mix, which must
            # not depend on the order the envs came back in)
            out = self.envs.recv(batch_size=int(self.sizes.integers(1, len(waiting) + 1)))
            ids = out[-1]["env_id"].tolist()
            waiting -= set(ids)
            self.record("recv", out, ids)


def _rows(value: Any, mask: np.ndarray) -> Any:
    """The rows `mask` picks of one batched info entry (nested dicts too)."""
    if isinstance(value, dict):
        return {k: _rows(v, mask) for k, v in value.items()}
    return value[mask]


@functools.cache
def _over_ray_calls(seed: int, gates: Path | None) -> dict[int, tuple[Any, ...]]:
    """The mix's histories over Ray calls, made once per seed."""
    return _Mix("ray", seed, gates).run()


@pytest.fixture(scope="module")
def gates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gates")


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("transport", ["auto", "tcp", "pipe"])
def test_every_envs_history_is_the_same_on_every_transport(transport, seed):
    """Each env's results over a random verb mix equal those over Ray calls."""
    assert_same(_Mix(transport, seed, None).run(), _over_ray_calls(seed, None))


@pytest.mark.parametrize("transport", ["auto", "tcp", "pipe"])
def test_with_env_errors_deaths_and_ctrl_c_every_envs_history_is_the_same_on_every_transport(
    transport, gates
):
    """The mix with faults: each env's results equal those over Ray calls."""
    theirs = _over_ray_calls(7, gates)
    seen = [
        str(item[0] if len(item) != 4 else sorted(item[3])) for h in theirs.values() for item in h
    ]
    for fault in ("given up", "env_error", "env_crashed"):  # (each fault took effect)
        assert sum(fault in what for what in seen) >= 3, fault
    assert_same(_Mix(transport, 7, gates).run(), theirs)
