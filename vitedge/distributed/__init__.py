"""Scale-out over Ray (the optional ``vitedge[ray]`` extra): the cluster, and sharded validation.

Ray is imported only inside functions of ``cluster`` (never at module top level), so
``import vitedge``, ``vitedge.runtime`` and every other command stay Ray-free.

    sharding      which items each shard gets (aligned to the evaluation batch)
    contract      the hashes a worker checks before it runs (bundle manifest, data)
    cluster       start/attach Ray, run tasks, turn dead workers into per-task failures
    shard_tasks   what one worker runs: a shard's raw outputs, or the latency alone
    ray_validate  `vitedge validate --workers/--ray-address`: shard, merge, same metrics

`vitedge build-matrix` is a workflow of the application layer (``vitedge.app.matrix``) that runs its rows
through ``cluster``; nothing here imports the application layer.
"""
