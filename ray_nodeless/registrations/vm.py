"""`registration: vm` (the default): the machine runs Ray itself, through Ray's updater over SSH or its own boot
script (EC2 user data / GCE startup-script) when node updaters are disabled."""
from __future__ import annotations

from ray_nodeless.registrations.base import Registration


class BareVM(Registration):
    """The machine runs Ray directly (Ray's updater over SSH, or user data / startup script)."""

    name = "vm"
