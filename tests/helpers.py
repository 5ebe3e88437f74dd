import numpy as np


def rel_err(out, ref) -> float:
    """max |out - ref| / max |ref|: error relative to the reference's scale."""
    out, ref = np.asarray(out, np.float64), np.asarray(ref, np.float64)
    return float(np.abs(out - ref).max() / max(np.abs(ref).max(), 1e-30))
