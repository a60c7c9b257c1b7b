"""What Ray's own GCP bootstrap (its `bootstrap_gcp`; the helpers reused: ray_compat/gcp_bootstrap.py) does for a `type:
gcp` YAML,
done for `cloud: gcp` (registration `vm`: the machines are reached over SSH by Ray's updater):

    step              how                                               fills (as Ray does)
    project_id        GcpSettings (required, non-empty string)          (`project_id: null` is a ConfigError)
    ssh keys          google-cloud-compute projects.get /               auth.ssh_private_key; the public key in
                      setCommonInstanceMetadata, with Ray's own key     the project's `ssh-keys` metadata
                      helpers (generate_ssh_key_name/_paths,
                      generate_rsa_key_pair) and naming
    subnet            google-cloud-compute subnetworks.list (region)    node_config.networkInterfaces (the first
                                                                        subnet, External NAT), as Ray's
                                                                        `_configure_subnet`
    service account   Ray's `_configure_iam_role(config, crm, iam)`     head_node.serviceAccounts (head only)
                      with googleapiclient IAM / Resource Manager
                      clients

These go through `provider.api_endpoint` and `provider.credentials` (or Ray's `gcp_credentials`) like the backend's
calls, so a fake or private Compute endpoint serves them. Not covered against a fake: the service-account step needs
the IAM and Cloud Resource Manager APIs, which neither google-cloud-compute nor the fake GCE server
(ray_nodeless.testing.fake_gce) provides; it runs only with real credentials (`credentials` unset: Application
Default Credentials, or `gcp_credentials`) and is skipped, with a warning, with `credentials: anonymous`. Ray's
`_configure_project` (which *creates* a missing project) is not reused: a missing project is an error of the first
Compute call instead.

`local-player` and `kubernetes` registrations run none of these steps (no SSH; the backend's default network).
"""
from __future__ import annotations

import copy
import logging
import os
from functools import partial
from typing import Any

from ray_nodeless.errors import ConfigError
from ray_nodeless.providers.gcp.clients import compute_client_kwargs
from ray_nodeless.providers.gcp.settings import ANONYMOUS, GcpSettings
from ray_nodeless.ray_compat import gcp_bootstrap as ray_gcp

logger = logging.getLogger(__name__)

SSH_KEYS_METADATA_KEY = "ssh-keys"
# Ray tries this many key names before giving up (its _configure_key_pair).
MAX_KEY_NAMES = 10
# Project metadata writes conflict (412) when another writer changed the fingerprint; Ray retries the same way.
METADATA_ATTEMPTS = 5
OPERATION_TIMEOUT_S = 120.0


def bootstrap_gcp_resources(config: dict[str, Any], settings: GcpSettings, registration: str) -> bool:
    """Run the steps for `registration` on `config` (in place). True when a step ran."""
    if registration != "vm":
        return False
    _configure_ssh_key(config, settings)
    _configure_subnet(config, settings)
    _configure_service_account(config, settings)
    return True


def _configure_ssh_key(config: dict[str, Any], settings: GcpSettings) -> None:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    auth = config.setdefault("auth", {})
    if "ssh_private_key" in auth:
        return
    ssh_user = auth.get("ssh_user")
    if not ssh_user:
        raise ConfigError("auth.ssh_user", "required: the user Ray's updater logs in as (Ray's GCP default: ubuntu)")
    kwargs = compute_client_kwargs(settings.api_endpoint, settings.client_credentials())
    projects = compute_v1.ProjectsClient(**kwargs)
    try:
        project = projects.get(project=settings.project_id, timeout=settings.call_timeout_s)
        keys = [ln for ln in _ssh_keys(project).split("\n") if ln]
        for i in range(MAX_KEY_NAMES):
            name = ray_gcp.ssh_key_name("gcp", i, settings.region, settings.project_id, ssh_user)
            public_path, private_path = ray_gcp.ssh_key_paths(name)
            # Ray's test: a project key of this user whose private key file exists here.
            if any(len(k.split(" ")) == 3 and k.split(" ")[2] == ssh_user for k in keys) \
                    and os.path.exists(private_path):
                break
            if os.path.exists(private_path):
                continue
            public_key, private_key = ray_gcp.generate_rsa_key_pair()
            _add_project_ssh_key(projects, settings, f"{ssh_user}:{public_key} {ssh_user}")
            os.makedirs(os.path.dirname(private_path), exist_ok=True)
            with open(private_path, "w", opener=partial(os.open, mode=0o600)) as f:
                f.write(private_key)
            with open(public_path, "w") as f:
                f.write(public_key)
            break
        else:
            raise ConfigError("auth.ssh_private_key", f"no usable key name for user {ssh_user!r} after "
                                                      f"{MAX_KEY_NAMES} tries; set auth.ssh_private_key")
    except gexc.GoogleAPICallError as e:
        raise ConfigError("auth.ssh_private_key", f"could not set up the project SSH key in project "
                                                  f"{settings.project_id!r}: {e}; set auth.ssh_private_key (and "
                                                  "add its public key to the project) to skip this step") from None
    finally:
        projects.transport.close()
    auth["ssh_private_key"] = private_path
    logger.info("ssh key for %s: %s", ssh_user, private_path)


def _ssh_keys(project: Any) -> str:
    for item in project.common_instance_metadata.items:
        if item.key == SSH_KEYS_METADATA_KEY:
            return item.value or ""
    return ""


def _add_project_ssh_key(projects: Any, settings: GcpSettings, line: str) -> None:
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    ops = compute_v1.GlobalOperationsClient(**compute_client_kwargs(settings.api_endpoint,
                                                                    settings.client_credentials()))
    try:
        for attempt in range(METADATA_ATTEMPTS):
            project = projects.get(project=settings.project_id, timeout=settings.call_timeout_s)
            md = compute_v1.Metadata(fingerprint=project.common_instance_metadata.fingerprint,
                                     items=list(project.common_instance_metadata.items))
            for item in md.items:
                if item.key == SSH_KEYS_METADATA_KEY:
                    item.value = (item.value + "\n" + line) if item.value else line
                    break
            else:
                md.items.append(compute_v1.Items(key=SSH_KEYS_METADATA_KEY, value=line))
            try:
                op = projects.set_common_instance_metadata_unary(project=settings.project_id, metadata_resource=md,
                                                                 timeout=settings.call_timeout_s)
            except gexc.PreconditionFailed:
                if attempt == METADATA_ATTEMPTS - 1:
                    raise
                continue
            done = ops.wait(project=settings.project_id, operation=op.name, timeout=OPERATION_TIMEOUT_S)
            if done.error and done.error.errors:
                raise ConfigError("auth.ssh_private_key",
                                  f"setCommonInstanceMetadata failed: {done.error.errors[0].message}")
            return
    finally:
        ops.transport.close()


def _configure_subnet(config: dict[str, Any], settings: GcpSettings) -> None:
    """Ray's `_configure_subnet`: node types without networkInterfaces get the region's first subnet."""
    from google.api_core import exceptions as gexc
    from google.cloud import compute_v1

    node_configs = [nt.setdefault("node_config", {}) for nt in config["available_node_types"].values()]
    if all("networkInterfaces" in nc for nc in node_configs):
        return
    client = compute_v1.SubnetworksClient(**compute_client_kwargs(settings.api_endpoint,
                                                                  settings.client_credentials()))
    try:
        subnets = list(client.list(project=settings.project_id, region=settings.region,
                                   timeout=settings.call_timeout_s))
    except gexc.GoogleAPICallError as e:
        raise ConfigError("provider.region", f"cannot list the subnets of {settings.region!r} in project "
                                             f"{settings.project_id!r}: {e}") from None
    finally:
        client.transport.close()
    if not subnets:
        raise ConfigError("available_node_types.*.node_config.networkInterfaces",
                          f"project {settings.project_id!r} has no subnet in region {settings.region!r}; create "
                          "one or set networkInterfaces")
    default = [{"subnetwork": subnets[0].self_link,
                "accessConfigs": [{"name": "External NAT", "type": "ONE_TO_ONE_NAT"}]}]
    for nc in node_configs:
        if "networkInterfaces" not in nc:
            nc["networkInterfaces"] = copy.deepcopy(default)


def _configure_service_account(config: dict[str, Any], settings: GcpSettings) -> None:
    """Ray's `_configure_iam_role`, with IAM and Resource Manager clients of our credentials."""
    head = config["head_node_type"]
    head_nc = config["available_node_types"][head].get("node_config") or {}
    if "serviceAccounts" in head_nc or "serviceAccounts" in (config.get("head_node") or {}):
        return
    if settings.credentials == ANONYMOUS:
        logger.warning("credentials: anonymous: the head's service account is not set up (Ray's GCP bootstrap "
                       "needs the IAM and Resource Manager APIs); set node_config.serviceAccounts on the head")
        return
    from googleapiclient import discovery

    creds = settings.client_credentials()      # None: Application Default Credentials
    crm = discovery.build("cloudresourcemanager", "v1", credentials=creds, cache_discovery=False)
    iam = discovery.build("iam", "v1", credentials=creds, cache_discovery=False)
    view = {"provider": {"project_id": settings.project_id, "region": settings.region},
            "head_node": {}, "available_node_types": config["available_node_types"]}
    try:
        view = ray_gcp.configure_iam_role(view, crm, iam)
    except Exception as e:  # noqa: BLE001 - googleapiclient HttpError, auth errors, Ray's assertions
        raise ConfigError(f"available_node_types.{head}.node_config.serviceAccounts",
                          f"Ray's GCP bootstrap could not set up the head's service account: {e}; set "
                          "serviceAccounts on the head's node_config to skip this step") from None
    config.setdefault("head_node", {})["serviceAccounts"] = view["head_node"]["serviceAccounts"]
