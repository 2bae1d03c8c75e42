"""The worker side: what runs in each worker actor's process, and imports nothing of the driver.

`env_worker.py` is the actor (`EnvWorker`: K envs on one thread), `batch.py` its reset and step
of those envs (`WorkerBatch`), `rows.py` its rows of the batch (`WorkerRows`). What both sides
agree on (the pipe protocol, the shared-memory layout, the info columns) is in `_protocol/`.
"""
