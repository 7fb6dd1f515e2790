"""Configs that drop a vitedge bundle into camera apps: DeepStream's nvinfer (deepstream.py) and
a Triton model repository (triton.py); exports.py writes them into a bundle or a folder."""
