"""The application layer: `vitedge build` (pipeline), `vitedge validate` and `vitedge compare`
(`validate`, `compare`: a typed request in, reports out), the completion of a bundle on the
device (`vitedge engine`), the build report and the terminal summary.

Everything below this layer (models, calibration, quantize, backends, validation, budget)
is a library; this layer strings it into the workflows the commands run.
"""
