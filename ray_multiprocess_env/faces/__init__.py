"""The faces: one module per ecosystem, each holding only that ecosystem's conventions.

`pfrl.py` (`RayVectorEnv`, pfrl's ``MultiprocessVectorEnv`` interface; `pfrl_make.py` its
constructors, `pfrl_results.py` its per-env tuples, `pfrl_bridge.py` the old gym API,
`remote_env.py` one env in an actor as a `gymnasium.Env`),
`gymnasium.py` (`GymnasiumVectorEnv`; `gymnasium_make.py` `make_vector_env` and
`vector_entry_point`), `sb3.py`, `tianshou.py` (with `tianshou_make.py` and
`tianshou_results.py`) and `rllib.py`. Every face runs on the private engine (`_engine/`) and
never sees its workers. The stable-baselines3 and Tianshou faces import their library (and so
torch) when first imported; nothing here is imported by ``import ray_multiprocess_env`` that
would import them.
"""
