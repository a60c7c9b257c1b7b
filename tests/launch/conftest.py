"""Fixtures the launch tests share with tests/ray_adapter: the in-memory cloud and a provider over it."""
from tests.ray_adapter.test_provider import cloud, provider  # noqa: F401 (fixtures, found by pytest by name)
