"""The LICENSE file is the Apache License 2.0 that pyproject.toml declares, word for word (issue 31): the text's
sha256 is that of apache.org's LICENSE-2.0.txt, so an edit or a truncated copy fails here."""
from __future__ import annotations

import hashlib
import pytest

from tests import REPO_ROOT

tomllib = pytest.importorskip("tomllib")     # Python 3.11+

# sha256 of https://www.apache.org/licenses/LICENSE-2.0.txt (the 202-line text with its appendix).
APACHE_2_SHA256 = "cfc7749b96f63bd31c3c42b5c471bf756814053e847c10f3eb003417bc523d30"


def test_the_license_file_is_the_apache_2_text_pyproject_declares() -> None:
    text = (REPO_ROOT / "LICENSE").read_bytes()
    assert hashlib.sha256(text).hexdigest() == APACHE_2_SHA256
    assert b"Apache License\n                           Version 2.0, January 2004" in text
    project = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
