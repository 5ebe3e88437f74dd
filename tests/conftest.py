import os
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# XLA's compilations kept on disk, shared by the xdist workers, the CLI's subprocesses and later runs:
# co-design's descent step alone takes about 30 s to compile, and each process that descends (a
# worker running tests/test_codesign.py, `stagec codesign` in tests/test_cli_commands.py) would
# compile it again.  JAX keys an entry by the program and the jax/jaxlib versions and flags.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), f"stagec-jax-{os.getuid()}"))

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.load_profile("ci")
