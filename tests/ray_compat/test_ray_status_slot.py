"""The run a `ray status` block belongs to (ray_nodeless/ray_compat/ray_status.py): the start of the Ray session, as
Ray 2.60's head names it. Checked against the installed Ray's source, so a Ray that changes the name's format fails
here rather than scoping the block wrongly."""
from __future__ import annotations

import datetime
import inspect
import os
import time

from ray_nodeless.ray_compat.ray_status import session_started


def test_rays_head_still_names_its_session_by_its_local_start_time():
    from ray._private import node

    src = inspect.getsource(node.Node.__init__)
    assert "datetime.datetime.today()" in src and '"%Y-%m-%d_%H-%M-%S_%f"' in src
    assert 'f"session_{date_str}_{os.getpid()}"' in src
    assert '"session_name"' in src and "KV_NAMESPACE_SESSION" in src


def test_the_session_name_gives_the_runs_start():
    # Exactly as the head does (node.py: datetime.today(), local time, microseconds, then the pid).
    before = time.time()
    name = f"session_{datetime.datetime.today().strftime('%Y-%m-%d_%H-%M-%S_%f')}_{os.getpid()}"
    assert before - 0.01 <= session_started(name) <= time.time() + 0.01
    assert session_started("session_latest") is None
    assert session_started("not a session") is None
