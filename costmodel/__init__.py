"""Differentiable analytical cost model of the accelerator."""
