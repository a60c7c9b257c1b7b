"""The AWS backend's provider-block keys and its node_config checks: config-time only, no client, no network.

    provider:
      cloud: aws
      region: us-west-2
      image_id: ami-0123456789abcdef0          # default ImageId for node types whose node_config has none
      subnets: {us-west-2a: subnet-0aa...}      # zone -> subnet; only these zones are planned
      endpoint_url: http://127.0.0.1:5000       # default: botocore's (AWS_ENDPOINT_URL honoured)
      aws_credentials: {profile_name: ml}       # boto3 Session arguments
      aws_max_attempts: 5
      aws_retry_mode: standard
      aws_retry_base_delay_s: 0.5
      aws_describe_page_size: 1000
"""
from __future__ import annotations

import functools
from typing import Annotated, Any, Literal, Mapping

from pydantic import Field, SecretStr, model_validator
from pydantic_core import PydanticCustomError

from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.core.schema import Section
from ray_nodeless.errors import ConfigError

# Attempts per EC2 call, the first one included: botocore's for every call but RunInstances, ours for RunInstances.
# Five rides out a typical throttling burst (RequestLimitExceeded) without holding an autoscaler update for long.
DEFAULT_MAX_ATTEMPTS = 5
# First backoff of our RunInstances loop; doubled per retry (full jitter), capped by backend.RUN_BACKOFF_CAP_S.
DEFAULT_RETRY_BASE_DELAY_S = 0.5
# DescribeInstances MaxResults bounds, as EC2 defines them; the default is the largest page (fewest calls).
MIN_DESCRIBE_PAGE_SIZE = 5
MAX_DESCRIBE_PAGE_SIZE = 1000

# RunInstances parameters ray_nodeless sets itself; a node_config that sets them is a config error.
MANAGED_KEYS = frozenset({"MinCount", "MaxCount", "ClientToken", "DryRun"})
# Keys of Ray's AWS node_config that are not RunInstances parameters but that Ray (and we) accept.
EXTRA_KEYS = frozenset({"SubnetIds"})
# node_config keys that must be lists when present (EC2 would reject anything else only at launch time).
LIST_KEYS = ("SubnetIds", "SecurityGroupIds", "BlockDeviceMappings", "NetworkInterfaces", "TagSpecifications")

NonEmpty = Annotated[str, Field(min_length=1)]


class AwsCredentials(Section):
    """`provider.aws_credentials`: the arguments of `boto3.session.Session` that a YAML can hold.

    Not accepted: `region_name` (provider.region is the one region, for the clients and the planner alike) and
    `botocore_session` (a Python object)."""

    model_config = Section.model_config | {"extra": "forbid"}

    aws_access_key_id: NonEmpty | None = None
    aws_secret_access_key: SecretStr | None = None      # SecretStr: never in a repr, a log line or a traceback
    aws_session_token: SecretStr | None = None
    profile_name: NonEmpty | None = None
    aws_account_id: NonEmpty | None = None

    @model_validator(mode="before")
    @classmethod
    def _mapping_with_unknown_values_hidden(cls, data: Any) -> Any:
        if not isinstance(data, Mapping):
            raise PydanticCustomError("dict_type", "must be a mapping")
        # A misspelt key usually holds a secret, and errors quote the value they reject.
        return {k: (v if k in cls.model_fields else "<hidden>") for k, v in data.items()}

    def session_kwargs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for name in type(self).model_fields:
            value = getattr(self, name)
            if value is not None:
                out[name] = value.get_secret_value() if isinstance(value, SecretStr) else value
        return out


class AwsSettings(Section):
    """Every provider-block key the AWS backend reads."""

    region: NonEmpty
    image_id: NonEmpty | None = None
    subnets: dict[NonEmpty, NonEmpty] | None = None
    endpoint_url: NonEmpty | None = None
    aws_credentials: AwsCredentials | None = None
    aws_max_attempts: int = Field(DEFAULT_MAX_ATTEMPTS, ge=1)
    aws_retry_mode: Literal["standard", "adaptive", "legacy"] = "standard"     # botocore's retry modes
    aws_retry_base_delay_s: float = Field(DEFAULT_RETRY_BASE_DELAY_S, ge=0)
    aws_describe_page_size: int = Field(MAX_DESCRIBE_PAGE_SIZE, ge=MIN_DESCRIBE_PAGE_SIZE, le=MAX_DESCRIBE_PAGE_SIZE)

    def session_kwargs(self) -> dict[str, str]:
        return self.aws_credentials.session_kwargs() if self.aws_credentials else {}


@functools.cache
def accepted_node_config_keys() -> frozenset[str]:
    """node_config keys this backend accepts: every RunInstances parameter of the installed botocore (what Ray's
    AWS provider passes on), SubnetIds, and the requirement keys (the raw node_config may still hold them)."""
    import botocore.session

    service = botocore.session.get_session().get_service_model("ec2")
    run_instances = frozenset(service.operation_model("RunInstances").input_shape.members)
    return (run_instances | EXTRA_KEYS | REQUIREMENT_KEYS) - MANAGED_KEYS


def check_node_config(settings: AwsSettings, node_config: Mapping[str, Any], key: str) -> None:
    """ConfigError (naming `key`.<field>) for node_config keys that cannot work."""
    accepted = accepted_node_config_keys()
    for name in node_config:
        if name in MANAGED_KEYS:
            raise ConfigError(f"{key}.{name}", f"{name} is set by ray_nodeless for every launch; remove it")
        if name not in accepted:
            close = sorted(k for k in accepted if k.lower() == str(name).lower())
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{key}.{name}", f"not a RunInstances parameter{hint}")
    if not node_config.get("ImageId") and not settings.image_id and "LaunchTemplate" not in node_config:
        raise ConfigError(f"{key}.ImageId",
                          "no AMI: set node_config.ImageId (or provider.image_id, or a LaunchTemplate)")
    for list_key in LIST_KEYS:
        if list_key in node_config and not isinstance(node_config[list_key], list):
            raise ConfigError(f"{key}.{list_key}", "must be a list")
    it = node_config.get("InstanceType")
    if it is not None and not isinstance(it, str):
        raise ConfigError(f"{key}.InstanceType", "must be one instance type name")
    if isinstance(node_config.get("SubnetIds"), list) and "SubnetId" in node_config:
        raise ConfigError(f"{key}.SubnetId", "set SubnetIds or SubnetId, not both")


def requirement_overrides(settings: AwsSettings, node_config: Mapping[str, Any]) -> dict[str, Any]:
    """Requirement keys implied by node_config and the provider block (static knowledge only, no API call)."""
    out: dict[str, Any] = {}
    it = node_config.get("InstanceType")
    if isinstance(it, str) and it:
        # Ray's meaning of InstanceType ("launch this") becomes an allow-list of one; the offering still picks
        # zone and capacity.
        out["instance_types"] = [it]
    # Zones without a configured subnet cannot be launched into.
    if settings.subnets and not node_config.get("SubnetIds") and not node_config.get("SubnetId"):
        out["zones"] = sorted(settings.subnets)
    return out
