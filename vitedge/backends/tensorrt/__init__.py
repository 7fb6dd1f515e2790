"""The TensorRT backend, one module per job (import TensorRT itself only where used).

plan (settings -> BuildPlan, trtexec line), versions (the API of each release, recorded from its
bindings in surface/, and NVIDIA's platform facts), typed (the strongly typed cast graph for TensorRT 10.12+), attention (fused-MHA checks before
the build), build (apply_plan: the TensorRT API calls), engine_inspect (what the engine
really holds), device (device facts and the engine compatibility check), runner
(TensorRtRunner on cuda-python), members (the family types and the member-selection rules),
family (one plan per member of a target family), bundle (plan files and the on-device
build), report (report.md lines), backend (the Backend the registry names), completion (the one
entry the application layer uses to complete a bundle on the device). Completing a bundle on the
device (`vitedge engine`) is vitedge.app.engine_completion's job.
"""
