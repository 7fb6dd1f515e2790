"""Parity validation: accuracy against FP32 and labels, latency, and the gate."""
