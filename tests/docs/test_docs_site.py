"""The documentation site builds as `make docs` builds it (mkdocs --strict: a warning is an error, among them a page
missing from the nav and a link to a page that does not exist), offline (Material needs no network at build time),
and every internal link of the built site lands: on a file of the site and, with a `#fragment`, on an element with
that id (a heading's anchor). README.md's links into docs/ are checked against the same build: the file exists and
its anchor is a heading of the page."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from tests import REPO_ROOT

MKDOCS = Path(sys.executable).parent / "mkdocs"


class _Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.links: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(a["id"])
        if tag == "a" and a.get("href"):
            self.links.append(a["href"])


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> dict[Path, _Page]:
    out = tmp_path_factory.mktemp("site")
    # No proxy and an unroutable one: a build that reached for the network would fail here, not pass by luck.
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTPS_PROXY": "http://127.0.0.1:9", "HTTP_PROXY":
           "http://127.0.0.1:9"}
    r = subprocess.run([str(MKDOCS), "build", "--strict", "--site-dir", str(out)], cwd=REPO_ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "WARNING" not in r.stderr, r.stderr
    pages = {}
    for html in out.rglob("*.html"):
        p = _Page()
        p.feed(html.read_text())
        pages[html] = p
    return pages


def _root(site: dict[Path, _Page]) -> Path:
    """The site's top: the directory of its index.html and 404.html."""
    return min(site, key=lambda p: len(p.parts)).parent


def _target(root: Path, html: Path, href: str) -> tuple[Path, str] | None:
    """The file and fragment an internal link points at; None for an external one. A root-relative link (404.html's,
    without a site_url) is read from the site's top."""
    parts = urlsplit(href)
    if parts.scheme or parts.netloc or href.startswith("mailto:"):
        return None
    base = root if parts.path.startswith("/") else html.parent
    path = (base / unquote(parts.path).lstrip("/")).resolve() if parts.path else html
    if path.is_dir() or parts.path.endswith("/"):
        path = path / "index.html"
    return path, unquote(parts.fragment)


def test_the_site_builds_strict_with_every_page(site):
    names = {p.parent.name for p in site}
    docs = {p.stem for p in (REPO_ROOT / "docs").glob("*.md") if p.stem != "index"}
    assert docs <= names, docs - names
    assert (REPO_ROOT / "docs" / "reference" / "provider-keys.md").exists()


def test_every_internal_link_and_anchor_lands(site):
    bad, root = [], _root(site)
    for html, page in site.items():
        for href in page.links:
            target = _target(root, html, href)
            if target is None:
                continue
            path, fragment = target
            if not path.exists():
                bad.append(f"{html.parent.name}: {href} (no file)")
            elif fragment and path in site and fragment not in site[path].ids:
                bad.append(f"{html.parent.name}: {href} (no anchor {fragment!r})")
    assert bad == []


def test_the_pages_link_to_each_other(site):
    """Guards the link check: the pages' cross-references are links (dozens), some of them to a heading's anchor."""
    pages = [h for html, p in site.items() for h in p.links if re.match(r"\.\./[a-z-]+/(#[a-z].*)?$", h)]
    anchors = [h for h in pages if "#" in h]
    assert len(pages) >= 20 and len(anchors) >= 5, pages


def test_readme_links_into_the_docs_land(site):
    text = (REPO_ROOT / "README.md").read_text()
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert len([x for x in links if x.startswith("docs/")]) >= 10
    root = _root(site)
    bad = []
    for link in links:
        if urlsplit(link).scheme:
            continue
        path, _, fragment = link.partition("#")
        if not (REPO_ROOT / path).exists():
            bad.append(f"{link} (no file)")
            continue
        if fragment:
            rel = Path(path).relative_to("docs").with_suffix("")
            html = root / ("index.html" if rel.name == "index" else rel / "index.html")
            if fragment not in site[html].ids:
                bad.append(f"{link} (no anchor {fragment!r})")
    assert bad == []
