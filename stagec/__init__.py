"""stagec: a staged compiler, hosted in JAX, for on-device ML accelerators."""
