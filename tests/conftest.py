"""Hypothesis profiles: CI replays a fixed set of examples (a red CI must mean a change broke something, not that
a new random example was drawn); developers explore with fresh random examples. HYPOTHESIS_PROFILE overrides."""
import os

from hypothesis import settings

settings.register_profile("ci", derandomize=True, print_blob=True)
settings.register_profile("dev", print_blob=True)
settings.register_profile("explore", max_examples=2000, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "dev"))
