"""What Ray's own AWS bootstrap (its `bootstrap_aws`) does for a `type: aws` YAML, done for `cloud: aws` by calling
the installed Ray's own step functions (ray_compat/aws_bootstrap.py) on a Ray-shaped copy of the config and
copying what they filled back into ours:

    step                       Ray function                   fills (as Ray does)
    default AMI                DEFAULT_AMI / _check_ami       node_config.ImageId (Ray's DLAMI of the region)
    launch templates, NICs     _configure_from_launch_template, _configure_from_network_interfaces (read; a
                               template's InstanceType / InstanceMarketOptions are pinned into node_config)
    head IAM role + profile    _configure_iam_role            head_node.IamInstanceProfile (head only, like Ray)
    key pair                   _configure_key_pair            node_config.KeyName, auth.ssh_private_key
    subnets                    _configure_subnet              node_config.SubnetIds (+ `zones`: see below)
    security group             _configure_security_group      node_config.SecurityGroupIds

Differences from Ray, on purpose:
- The AMI is settled first, without any API call, so a missing AMI (a region Ray has no default for) fails
  `ray up` before anything is created in the account: not at head launch, and not after IAM roles and key pairs.
- Subnets: Ray keeps every usable subnet of the VPC (filtered by `provider.availability_zone`); ray_nodeless plans
  zones itself, so each node type keeps only the subnets in the zones its rule and node_config allow, and its
  `zones` requirement is narrowed to the zones of those subnets: the planner never picks a zone it cannot launch
  into (plan == launch). `provider.subnets` ({zone: subnet}) and subnets tagged `ray-nodeless-subnet` are handed to
  Ray's step as the node type's subnets (validated the same way; the security group goes into their VPC).
- Ray's steps build their boto3 resources from the Ray-shaped config's `provider.aws_credentials`, which carries
  the credentials our provider block resolves to (its `aws_credentials`, profile_name too, which Ray's own
  `aws_credentials` cannot take, else the default chain), and `endpoint_url` for every service the steps call (EC2
  and IAM); without `endpoint_url`, botocore's own endpoint resolution applies (AWS_ENDPOINT_URL and
  AWS_ENDPOINT_URL_<SERVICE> honoured).
- Ray waits 15 s (twice) after creating the IAM profile and role, for IAM propagation. Against a custom endpoint
  (`endpoint_url` or AWS_ENDPOINT_URL set: moto, a proxy) that wait is skipped.
- Ray aborts with `cli_logger.abort` / assertions; here every failure is a ConfigError naming the key to set.

Which steps run depends on `provider.registration`: `vm` runs all of them; `local-player` (machines played by
local Ray nodes: no SSH, and Ray runs on this host with this host's credentials, so no instance role) the subnets
and the security group; `kubernetes` only the AMI (its machines join a Kubernetes cluster;
Ray's SSH, IAM and security-group set-up does not apply to them).
"""
from __future__ import annotations

import copy
import logging
import os
from typing import Any, Callable, Mapping, TypeVar

from ray_nodeless.core.requirements import REQUIREMENT_KEYS
from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.aws.images import LATEST_DLAMI, default_ami, fill_default_images  # noqa: F401 (API)
from ray_nodeless.providers.aws.settings import AwsSettings, market_options
from ray_nodeless.providers.aws.subnets import SUBNET_DISCOVERY_TAG
from ray_nodeless.ray_compat.aws_bootstrap import RayAwsSteps, aborts, ray_aws_steps

logger = logging.getLogger(__name__)

T = TypeVar("T")

# The node_config keys Ray's steps fill and that are copied back into ours.
FILLED_KEYS = ("ImageId", "KeyName", "SubnetIds", "SecurityGroupIds")
# The keys of a launch template that decide what is launched, pinned into the node_config (see _template_pins).
TEMPLATE_PINNED_KEYS = ("InstanceType", "InstanceMarketOptions")
# Environment variables that point botocore at another endpoint (then there is no IAM propagation to wait for).
ENDPOINT_ENV = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_IAM")

STEPS_BY_REGISTRATION = {
    "vm": ("iam", "key_pair", "subnet", "security_group"),
    "local-player": ("subnet", "security_group"),
    "kubernetes": (),
}


def custom_endpoint(settings: AwsSettings) -> bool:
    return bool(settings.endpoint_url or any(os.environ.get(k) for k in ENDPOINT_ENV))


def bootstrap_aws_resources(config: dict[str, Any], settings: AwsSettings, registration: str,
                            allowed_zones: Mapping[str, frozenset[str] | None]) -> dict[str, Any]:
    """Run Ray's AWS bootstrap steps for `registration` and copy their results into `config` (in place; also
    returned). `allowed_zones`: node type -> the zones its rule and node_config allow (None: any)."""
    steps = STEPS_BY_REGISTRATION.get(registration, STEPS_BY_REGISTRATION["vm"])
    node_types = config["available_node_types"]
    view = _ray_view(config, settings, allowed_zones)
    view["provider"]["aws_credentials"] = _ray_credentials(settings)
    with ray_aws_steps(wait_for_iam_propagation=not custom_endpoint(settings)) as rc:
        view = _step("launch templates", "available_node_types.*.node_config.LaunchTemplate",
                     rc.launch_template, view)
        template_pins = {name: _template_pins(name, node_types[name].get("node_config") or {}, t["node_config"])
                         for name, t in view["available_node_types"].items()}
        view = _step("network interfaces", "available_node_types.*.node_config.NetworkInterfaces",
                     rc.network_interfaces, view)
        fed: set[str] = set()
        if "subnet" in steps:
            fed = _step("subnets", "provider.subnets", lambda v: _feed_subnets(v, settings, rc), view)
        before = {n: copy.deepcopy(t["node_config"]) for n, t in view["available_node_types"].items()}
        head = config["head_node_type"]
        if "iam" in steps:
            view = _step("head IAM instance profile",
                         f"available_node_types.{head}.node_config.IamInstanceProfile", rc.iam_role, view)
        if "key_pair" in steps:
            view = _step("key pair", "auth.ssh_private_key (with node_config.KeyName)", rc.key_pair, view)
        if "subnet" in steps:
            view = _step("subnets", "available_node_types.*.node_config.SubnetIds", rc.subnet, view)
        if "security_group" in steps:
            view = _step("security group", "available_node_types.*.node_config.SecurityGroupIds",
                         rc.security_group, view)
        _step("AMI", "available_node_types.*.node_config.ImageId", rc.check_ami, view)     # checks, changes nothing
        subnet_zones = _step("subnets", "available_node_types.*.node_config.SubnetIds",
                             lambda v: _subnet_zones(v, rc), view) if "subnet" in steps else {}

    for name, nt in node_types.items():
        ours = nt.setdefault("node_config", {})
        for key, value in template_pins[name].items():
            ours[key] = value
            logger.info("%s: %s %s from its launch template (pinned: the plan honours it)", name, key, value)
        theirs = view["available_node_types"][name]["node_config"]
        for key in FILLED_KEYS:
            if key in theirs and key not in before[name] and key not in ours:
                ours[key] = copy.deepcopy(theirs[key])
        if "subnet" in steps:
            _narrow_subnets(name, ours, theirs.get("SubnetIds") or [], subnet_zones, allowed_zones.get(name),
                            copy_subnets=name not in fed or not settings.subnets)
    profile = (view.get("head_node") or {}).get("IamInstanceProfile")
    if profile:
        # Like Ray: the head instance only, not workers of the head's node type (`ray up` merges `head_node` into
        # the head's node_config; the config the head's autoscaler gets has no `head_node`).
        config.setdefault("head_node", {})["IamInstanceProfile"] = profile
    key_path = (view.get("auth") or {}).get("ssh_private_key")
    if key_path and "key_pair" in steps:
        config.setdefault("auth", {})["ssh_private_key"] = key_path
    return config


# ------------------------------------------------------------------------------------------------ helpers


def _template_pins(name: str, ours: Mapping[str, Any], merged: Mapping[str, Any]) -> dict[str, Any]:
    """What a node type's launch template decides about the instance, as node_config keys to pin: its
    InstanceType and InstanceMarketOptions, unless the node_config sets them itself (they override the template in
    RunInstances, in Ray's provider too). `merged` is the node_config Ray's `_configure_from_launch_template` merged
    the template into. Without these pins the planner would pick its own type and capacity and the launch would
    override the template's with them: silently not what the template says. A template that chooses types by
    InstanceRequirements cannot be honoured (ray_nodeless launches the one type it planned): an error."""
    if "LaunchTemplate" not in ours:
        return {}
    key = f"available_node_types.{name}.node_config.LaunchTemplate"
    if "InstanceRequirements" in merged and "InstanceType" not in merged:
        raise ConfigError(key, "the launch template chooses instance types by InstanceRequirements, which "
                               "ray_nodeless cannot honour (it launches the one instance type it planned); state "
                               "the shape in the node type's resources and rules, or pin node_config.InstanceType")
    pins = {k: copy.deepcopy(merged[k]) for k in TEMPLATE_PINNED_KEYS if k in merged and k not in ours}
    if "InstanceMarketOptions" in pins:
        try:
            market_options(pins["InstanceMarketOptions"], "InstanceMarketOptions")
        except ConfigError as e:
            raise ConfigError(key, f"the launch template's {e}") from None
    if "InstanceType" in pins and (not isinstance(pins["InstanceType"], str) or not pins["InstanceType"]):
        raise ConfigError(key, f"the launch template's InstanceType {pins['InstanceType']!r} is not a type name")
    return pins


def _ray_view(config: Mapping[str, Any], settings: AwsSettings,
              allowed_zones: Mapping[str, frozenset[str] | None]) -> dict[str, Any]:
    """The config as Ray's steps want it: Ray's AWS provider block, node_configs with launch keys only."""
    p = config["provider"]
    provider: dict[str, Any] = {"type": "aws", "region": settings.region,
                                "use_internal_ips": bool(p.get("use_internal_ips", False))}
    for k in ("security_group", "key_pair", "cloudwatch"):
        if p.get(k) is not None:
            provider[k] = copy.deepcopy(p[k])
    zones = list(allowed_zones.values())
    if zones and all(z is not None for z in zones):
        provider["availability_zone"] = ",".join(sorted({z for zs in zones if zs is not None for z in zs}))
    elif p.get("availability_zone"):
        provider["availability_zone"] = str(p["availability_zone"])
    types_ = {}
    for name, nt in config["available_node_types"].items():
        nc = {k: copy.deepcopy(v) for k, v in (nt.get("node_config") or {}).items() if k not in REQUIREMENT_KEYS}
        if not nc.get("ImageId") and "LaunchTemplate" not in nc and settings.image_id:
            nc["ImageId"] = settings.image_id
        types_[name] = {"node_config": nc}
    return {"cluster_name": config.get("cluster_name", "default"), "head_node_type": config["head_node_type"],
            "available_node_types": types_, "head_node": copy.deepcopy(config.get("head_node") or {}),
            "auth": copy.deepcopy(config.get("auth") or {}), "provider": provider}


def _feed_subnets(view: dict[str, Any], settings: AwsSettings, rc: RayAwsSteps) -> set[str]:
    """Node types without subnets get provider.subnets, else the subnets tagged SUBNET_DISCOVERY_TAG, as theirs."""
    configured = list(dict.fromkeys((settings.subnets or {}).values()))
    if not configured:
        ec2 = rc.resource("ec2", view)
        configured = sorted(s.subnet_id for s in ec2.subnets.filter(
            Filters=[{"Name": "tag-key", "Values": [SUBNET_DISCOVERY_TAG]}]))
    if not configured:
        return set()
    fed = set()
    for name, nt in view["available_node_types"].items():
        nc = nt["node_config"]
        if not any(k in nc for k in ("SubnetIds", "SubnetId", "NetworkInterfaces")):
            nc["SubnetIds"] = list(configured)
            fed.add(name)
    return fed


def _subnet_zones(view: dict[str, Any], rc: RayAwsSteps) -> dict[str, tuple[str, str]]:
    ids = sorted({s for t in view["available_node_types"].values() for s in t["node_config"].get("SubnetIds") or []})
    if not ids:
        return {}
    ec2 = rc.resource("ec2", view)
    return {s.subnet_id: (s.availability_zone, getattr(s, "availability_zone_id", "") or "")
            for s in ec2.subnets.filter(Filters=[{"Name": "subnet-id", "Values": ids}])}


def _narrow_subnets(name: str, ours: dict[str, Any], subnets: list[str], zone_of: Mapping[str, tuple[str, str]],
                    allowed: frozenset[str] | None, copy_subnets: bool) -> None:
    """Keep the node type's subnets in its allowed zones, and narrow its `zones` to theirs."""
    if not subnets:
        return
    kept = [s for s in subnets if allowed is None or set(zone_of.get(s, ("", ""))) & allowed]
    if not kept:
        raise ConfigError(f"available_node_types.{name}.node_config.SubnetIds",
                          f"none of the subnets {subnets} is in the zones this node type may use "
                          f"{sorted(allowed or [])}")
    zones = sorted({zone_of[s][0] for s in kept if s in zone_of})
    if allowed is not None:
        zones = sorted(z for z in zones if z in allowed) or sorted(
            {zone_of[s][1] for s in kept if s in zone_of and zone_of[s][1] in allowed})
    if copy_subnets and "NetworkInterfaces" not in ours and "SubnetId" not in ours:
        ours["SubnetIds"] = kept
    if zones:
        ours["zones"] = zones


def _step(what: str, key: str, fn: Callable[[dict[str, Any]], T], view: dict[str, Any]) -> T:
    """One of Ray's steps, its aborts, assertions and API errors as a ConfigError naming what to set."""
    import botocore.exceptions

    try:
        return fn(view)
    except botocore.exceptions.NoCredentialsError as e:
        raise ConfigError("provider.aws_credentials", f"Ray's AWS bootstrap ({what}) needs AWS credentials: {e} "
                                                      "(set provider.aws_credentials, AWS_PROFILE or AWS_ACCESS_KEY_ID)"
                          ) from None
    except aborts() + (ValueError,) as e:
        raise ConfigError(key, f"Ray's AWS bootstrap ({what}) refused the config: {e}") from None
    except (botocore.exceptions.ClientError, botocore.exceptions.BotoCoreError) as e:
        raise ConfigError(key, f"Ray's AWS bootstrap ({what}) failed: {e}; set this key to an existing "
                               "resource to skip the step, or grant the permission it needs") from None


def _ray_credentials(settings: AwsSettings) -> dict[str, str]:
    """`provider.aws_credentials` for Ray's steps (keyword arguments of `boto3.resource`): the credentials our
    provider block resolves to, frozen (Ray's resources take no profile), and our endpoint. None resolved: Ray's
    default chain, which finds none either, and the step names provider.aws_credentials."""
    import botocore.exceptions

    from ray_nodeless.providers.aws.clients import session

    out: dict[str, str] = {}
    try:
        creds = session(settings.session_kwargs()).get_credentials()
        frozen = creds.get_frozen_credentials() if creds is not None else None
    except botocore.exceptions.BotoCoreError as e:
        raise ConfigError("provider.aws_credentials", f"cannot resolve AWS credentials for Ray's AWS bootstrap: {e}"
                          ) from None
    if frozen is not None:
        out = {"aws_access_key_id": frozen.access_key, "aws_secret_access_key": frozen.secret_key}
        if frozen.token:
            out["aws_session_token"] = frozen.token
    if settings.endpoint_url:
        out["endpoint_url"] = settings.endpoint_url
    return out
