"""`placement` and `actor_options` on the one-node test cluster: plans, groups, errors."""

from __future__ import annotations

import gymnasium as gym
import pytest
import ray
from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_multiprocess_env import (
    EnvCrashedError,
    GymnasiumVectorEnv,
    RayVectorEnv,
    make_remote_class,
    make_vector_env,
    plan_placement,
)
from tests.envs import GymHolder
from tests.helpers import placement_group_of


def _cartpole(index: int = 0) -> gym.Env:
    return gym.make("CartPole-v1")


def _state(group) -> str:
    return placement_group_table(group)["state"]


def test_no_placement_passes_actor_options_through():
    plan = plan_placement(None, 3, {"num_cpus": 0.25, "resources": {"x": 1}})
    assert plan.placement_group is None
    assert plan.options(2) == {"num_cpus": 0.25, "resources": {"x": 1}}


@pytest.mark.parametrize("strategy", ["PACK", "SPREAD", "STRICT_PACK", "pack"])
def test_strategy_names_reserve_one_bundle_per_worker_and_close_removes_it(strategy):
    envs = make_vector_env(
        _cartpole,
        num_workers=2,
        envs_per_worker=2,
        placement=strategy,
        actor_options={"num_cpus": 0.25},
        seed=0,
    )
    group = placement_group_of(envs)
    assert group.bundle_specs == [{"CPU": 0.25}, {"CPU": 0.25}]
    assert _state(group) == "CREATED"
    obs, _ = envs.reset()
    assert obs.shape == (4, 4)
    assert len(set(envs.node_ids())) == 1
    assert set(envs.node_ids()) == {ray.get_runtime_context().get_node_id()}
    envs.close()
    assert _state(group) == "REMOVED"


def test_bundles_hold_gpus_memory_and_custom_resources():
    """The test cluster has no GPU, so the group never gets ready; the error shows the bundle."""
    options = {"num_gpus": 1, "memory": 2**20, "resources": {"accel": 2}}
    bundle = r"\{'CPU': 1.0, 'GPU': 1.0, 'memory': 1048576.0, 'accel': 2.0\}"
    with pytest.raises(TimeoutError, match=rf"1 bundles of {bundle}.*add nodes"):
        plan_placement("PACK", 1, options, timeout=0.5)


def test_a_group_the_cluster_cannot_hold_times_out_and_is_removed():
    with pytest.raises(TimeoutError, match=r"3 bundles of \{'CPU': 1.0\}.*not ready after 0.5 s"):
        plan_placement("STRICT_PACK", 3, {"num_cpus": 1}, timeout=0.5)
    groups = ray.util.placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups if g["strategy"] == "STRICT_PACK")


def test_a_users_placement_group_is_used_round_robin_or_by_bundle_index_and_kept():
    group = placement_group([{"CPU": 0.1}, {"CPU": 0.1}], strategy="PACK")
    ray.get(group.ready(), timeout=30)
    try:
        plan = plan_placement(group, 3)
        indices = [
            plan.options(i)["scheduling_strategy"].placement_group_bundle_index for i in range(3)
        ]
        assert indices == [0, 1, 0]
        plan = plan_placement((group, [1, 1]), 2, {"num_cpus": 0.05})
        assert plan.options(0)["scheduling_strategy"].placement_group_bundle_index == 1
        Remote = make_remote_class(GymHolder, "env", gym.Env)
        vec = RayVectorEnv.from_remote_class(
            Remote,
            2,
            args=("CartPole-v1",),
            placement=(group, [1, 0]),
            actor_options={"num_cpus": 0.05},
        )
        vec.reset()
        vec.close()
        assert _state(group) == "CREATED"  # the user's group outlives the vector env
    finally:
        remove_placement_group(group)


def test_a_scheduling_strategy_object_is_used_for_every_actor():
    node = ray.get_runtime_context().get_node_id()
    strategy = NodeAffinitySchedulingStrategy(node_id=node, soft=False)
    Remote = make_remote_class(GymHolder, "env", gym.Env)
    with RayVectorEnv.from_remote_class(
        Remote, 2, args=("CartPole-v1",), placement=strategy
    ) as vec:
        assert vec.node_ids() == (node, node)
        assert vec.reset()[0][0].shape == (4,)


def test_node_ids_of_worker_and_per_env_actors():
    node = ray.get_runtime_context().get_node_id()
    with RayVectorEnv.from_env_fns([_cartpole] * 3, envs_per_worker=2) as vec:
        assert vec.node_ids() == (node,) * 3
    Remote = make_remote_class(GymHolder, "env", gym.Env)
    actor = Remote.remote("CartPole-v1")
    assert ray.get(actor.node_id.remote()) == node
    ray.kill(actor)


def test_node_ids_needs_the_method_on_plain_actors():
    @ray.remote
    class Plain:
        def reset(self):
            return 0

        def step(self, action):
            return 0, 0.0, False, {}

    with RayVectorEnv([Plain.remote()]) as vec, pytest.raises(ValueError, match="has no `node_id`"):
        vec.node_ids()


@pytest.mark.parametrize(
    ("placement", "error", "match"),
    [
        ("EVERYWHERE", ValueError, r"`placement` must be one of 'SPREAD'.*got 'EVERYWHERE'"),
        (3, TypeError, r"`placement` must be None.*got 3 \(int\)"),
        (("pg", [0]), TypeError, r"`placement` must be None"),
    ],
)
def test_bad_placements_name_the_argument(placement, error, match):
    with pytest.raises(error, match=match):
        plan_placement(placement, 2)


def test_placement_and_a_scheduling_strategy_in_actor_options_clash():
    with pytest.raises(ValueError, match=r"`actor_options` sets 'scheduling_strategy'.*only once"):
        plan_placement("PACK", 2, {"scheduling_strategy": "SPREAD"})


def test_bad_bundle_indices_name_the_problem():
    group = placement_group([{"CPU": 0.1}])
    ray.get(group.ready(), timeout=30)
    try:
        with pytest.raises(ValueError, match=r"gives 1 bundle indices for 2 actors"):
            plan_placement((group, [0]), 2)
        with pytest.raises(ValueError, match=r"bundle index 1 .* out of range: .* 1 bundles"):
            plan_placement((group, [0, 1]), 2)
        with pytest.raises(TypeError, match=r"bundle index '0' in `placement` must be an int"):
            plan_placement((group, ["0", 0]), 2)
        with pytest.raises(TypeError, match=r"list of ints, one per actor, got 0"):
            plan_placement((group, 0), 2)
    finally:
        remove_placement_group(group)


def test_actor_options_must_be_a_mapping():
    with pytest.raises(TypeError, match=r"`actor_options` must be a mapping.*got \[1\]"):
        plan_placement(None, 1, [1])


def test_options_ray_rejects_name_actor_options():
    with pytest.raises(ValueError, match=r"could not be created with the options.*actor_options"):
        GymnasiumVectorEnv([_cartpole], actor_options={"num_cpu": 1})


def test_from_remote_class_checks_its_arguments():
    with pytest.raises(TypeError, match=r"`actor_class` must be a Ray actor class.*got <class"):
        RayVectorEnv.from_remote_class(GymHolder, 2)
    Remote = make_remote_class(GymHolder, "env", gym.Env)
    with pytest.raises(ValueError, match=r"`num_envs` must be a positive int, got 0"):
        RayVectorEnv.from_remote_class(Remote, 0)


def test_a_failed_start_releases_the_group():
    with pytest.raises(TypeError, match="could not be sent"):
        RayVectorEnv.from_env_fns(
            [lambda: _cartpole(), _Unpicklable()], placement="PACK", actor_options={"num_cpus": 0.1}
        )
    groups = ray.util.placement_group_table().values()
    assert all(g["state"] == "REMOVED" for g in groups)


class _Unpicklable:
    def __init__(self) -> None:
        import threading

        self.lock = threading.Lock()

    def __call__(self) -> gym.Env:
        return _cartpole()


def test_sb3_and_the_vector_entry_point_pass_placement_through():
    pytest.importorskip("stable_baselines3")
    from ray_multiprocess_env import make_sb3_vec_env, vector_entry_point

    sb3_envs = make_sb3_vec_env(
        _cartpole,
        num_workers=2,
        envs_per_worker=1,
        placement="PACK",
        actor_options={"num_cpus": 0.25},
    )
    gym_envs = vector_entry_point(
        2, env_id="CartPole-v1", placement="SPREAD", actor_options={"num_cpus": 0.25}
    )
    groups = [
        placement_group_of(sb3_envs),
        placement_group_of(gym_envs),
    ]
    assert [group.bundle_count for group in groups] == [2, 2]
    assert sb3_envs.reset().shape == (2, 4)
    sb3_envs.close()
    gym_envs.close()
    assert [_state(group) for group in groups] == ["REMOVED", "REMOVED"]


def test_a_module_only_the_driver_has_is_named_with_the_runtime_env_fix(tmp_path, monkeypatch):
    """Workers cannot import a module added to the driver's path after Ray started."""
    (tmp_path / "driver_only_factories.py").write_text(
        "import gymnasium as gym\n\ndef make():\n    return gym.make('CartPole-v1')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import driver_only_factories

    with pytest.raises(
        EnvCrashedError, match=r"(?s)env 0 .*ModuleNotFoundError.*ray.init\(runtime_env="
    ):
        GymnasiumVectorEnv([driver_only_factories.make], timeout=60)
