"""Scale-out over Ray (the optional ``vitedge[ray]`` extra): sharded validation and build matrices.

Ray is imported only inside functions of ``cluster`` (never at module top level), so
``import vitedge``, ``vitedge.runtime`` and every other command stay Ray-free.

    sharding      which items each shard gets (aligned to the evaluation batch)
    contract      the hashes a worker checks before it runs (bundle manifest, data)
    cluster       start/attach Ray, run tasks, turn dead workers into per-task failures
    shard_tasks   what one worker runs: a shard's raw outputs, or the latency alone
    ray_validate  `vitedge validate --workers/--ray-address`: shard, merge, same metrics
    matrix_config matrix.toml -> checked rows (model, target, data, bundle folder)
    matrix_rows   one row on whichever process runs it: resume or the one build call
    matrix        `vitedge build-matrix`: calibration groups first, then the rest, on Ray or sequentially
    matrix_report one table, one JUnit file, one JSON for the whole matrix
"""
