"""The simulator: executes programs (vectorized), and times them."""
