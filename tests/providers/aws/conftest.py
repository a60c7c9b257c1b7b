"""Fixtures the AWS tests share: `aws`, a moto server with credentials and region in the environment."""
from tests.providers.aws.test_aws_bootstrap import aws  # noqa: F401 (a fixture, found by pytest by name)
