"""`vitedge build-matrix`: models x targets, each row one `vitedge build` (app/build), on Ray or sequentially.

    config   matrix.toml -> checked rows (model, target, data, bundle folder)
    rows     one row on whichever process runs it: resume or the one build call
    run      calibration groups first, then the rest, on Ray (``vitedge.distributed.cluster``) or sequentially
    report   one table, one JUnit file, one JSON for the whole matrix

A workflow of the application layer beside build and validate; the scale-out machinery it runs on is
``vitedge.distributed``, one layer below.
"""
