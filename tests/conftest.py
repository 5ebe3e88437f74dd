import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

from hypothesis import settings  # noqa: E402

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True)
settings.load_profile("ci")
