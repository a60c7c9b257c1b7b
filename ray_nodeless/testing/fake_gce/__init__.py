"""A small fake Compute Engine REST server that the real google-cloud-compute client talks to.

Google ships no Compute Engine emulator, and MagicMock-level fakes skip the parts that break in production:
serialization, URL shapes, pagination, filters, operation polling. This server sits behind
`compute_v1.*Client(transport="rest", client_options=ClientOptions(api_endpoint=url))` and implements just the
endpoints ray_nodeless uses, with GCE's observable semantics:

- every request body is validated against the real Compute API schema (`schema.py`), so a body the fake accepts is
  one GCE would parse;
- a few semantic checks GCE makes (`semantics.py`: label syntax, instance name syntax, unknown machine type, GPUs
  need `onHostMaintenance: TERMINATE`, spot cannot restart automatically); requestId must be a UUID;
- `requestId` idempotency: a repeated insert with the same requestId returns the same operation and creates
  nothing new (`handlers.py`);
- list filters (`filters.py`) and paging;
- fault injection (`faults.py`: capacity errors in the operation, quota 403, 429 throttling, "ambiguous" 5xx after
  the work was done, operations that stay RUNNING) and out-of-band changes (instances of other clusters,
  preemption);
- a request log (`server.requests`) for assertions on counts and ordering (`server.py`).

Operations complete synchronously unless `op_delay_polls` says otherwise; `wait` answers at once.
"""
from ray_nodeless.testing.fake_gce.faults import Fault
from ray_nodeless.testing.fake_gce.filters import filter_match, parse_filter
from ray_nodeless.testing.fake_gce.handlers import URL_ROOT
from ray_nodeless.testing.fake_gce.schema import ApiError, discovery, validate, validate_body
from ray_nodeless.testing.fake_gce.semantics import LABEL_KEY_RE, LABEL_VALUE_RE, METADATA_KEY_RE, NAME_RE
from ray_nodeless.testing.fake_gce.server import (
    BASE, DEFAULT_ACCELERATOR_TYPES, DEFAULT_MACHINE_TYPES, DEFAULT_ZONES, FakeGce, Request, client_kwargs,
)

__all__ = [
    "ApiError", "BASE", "DEFAULT_ACCELERATOR_TYPES", "DEFAULT_MACHINE_TYPES", "DEFAULT_ZONES", "FakeGce", "Fault",
    "LABEL_KEY_RE", "LABEL_VALUE_RE", "METADATA_KEY_RE", "NAME_RE", "Request", "URL_ROOT", "client_kwargs",
    "discovery", "filter_match", "parse_filter", "validate", "validate_body",
]
