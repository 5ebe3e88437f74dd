import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The suite compiles thousands of small XLA programs and runs each a few times: LLVM's optimizations
# cost more than they save there (about 15% of the suite's CPU time).  XLA's CPU backend keeps IEEE
# semantics at every level (no fast math), so results are those of the optimized build.
os.environ["XLA_FLAGS"] = " ".join(filter(None, (os.environ.get("XLA_FLAGS"), "--xla_backend_optimization_level=0",
                                                 "--xla_llvm_disable_expensive_passes=true")))
# XLA's compilations kept on disk, shared by the xdist workers, the CLI's subprocesses and later runs:
# co-design's descent step alone takes about 30 s to compile, and each process that descends (a
# worker running tests/test_codesign.py, `stagec codesign` in tests/test_cli_commands.py) would
# compile it again.  JAX keys an entry by the program and the jax/jaxlib versions and flags.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"stagec-jax-{os.getuid()}"))
# every compilation, not only those over a second: the executor's and cost model's small kernels,
# compiled by both workers and every CLI subprocess for the same shapes, are most of the suite's
# compile time (a cached one loads in about a millisecond)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.load_profile("ci")
