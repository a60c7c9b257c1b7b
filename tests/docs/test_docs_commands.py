"""The docs run as tests: every command and cluster YAML that README.md and docs/ show, so the docs cannot go stale.

- Every ```bash block is split into commands (continuation lines joined, a quoted argument over several lines kept
  whole). The `ray-nodeless` commands that need no cloud and no cluster (`plan`, `convert`, `catalog list/info`,
  `simulate`) run here, from the repo root, through the `ray-nodeless` group itself (click's CliRunner), and must
  exit 0, or 2 where the line's comment says `exit 2`. A path under /tmp is rewritten into the page's tmp dir
  (consistently, so a later `plan /tmp/x.yaml` reads what `convert -o /tmp/x.yaml` wrote); `> FILE` writes stdout.
- Every other command is listed below by kind (`ray up`, `make`, `kubectl`, ...) with why it is not run here; a
  command of a kind that is neither run nor listed fails the test, so a new kind of command in the docs is decided
  on, not skipped.
- A transcript line (`$ ray-nodeless ...`) in an untyped block runs too (exit 2 when the next line is its error);
  one of a file that is not in the repo is listed in SAMPLE_FILES. README's transcript is checked line by line
  against the real output of its YAML.
- Every ```yaml block that is a cluster YAML (`provider:` and `available_node_types:`) or a KubeRay cluster
  manifest (`apiVersion: ray.io/v1`) is planned by `ray-nodeless plan` (exit 0), or listed in FRAGMENTS with why.

BENCHMARKS.md (included in the site by docs/benchmarks.md) shows bench commands, run by benches/, not here.
"""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from tests import REPO_ROOT

PAGES = [REPO_ROOT / "README.md"] + sorted(p for p in (REPO_ROOT / "docs").rglob("*.md") if p.name != "benchmarks.md")

# `ray-nodeless` subcommands run here: they read the embedded catalog and files of the repo, nothing else.
RUN = {"ray-nodeless plan", "ray-nodeless convert", "ray-nodeless catalog list", "ray-nodeless catalog info",
       "ray-nodeless simulate"}

# Commands of these kinds are documented but not run here, each for its reason (the kind is the program, with the
# subcommand for `ray`, `ray-nodeless` and `make`).
NOT_RUN = {
    "ray up": "launches a cluster (tests/e2e runs `ray up` on the local backend, moto and the fake GCE)",
    "ray down": "needs a running cluster (tests/e2e)",
    "ray status": "needs a running cluster (tests/e2e/test_prometheus.py)",
    "ray-nodeless status": "lists a cluster's machines: a cloud or a local cluster (tests/cli, tests/e2e)",
    "ray-nodeless sweep": "ends a cluster's machines: needs the cloud (tests/operate, tests/e2e)",
    "ray-nodeless catalog refresh": "reads the cloud's APIs (tests/core/catalog against moto and the fake GCE)",
    "ray-nodeless trace record": "reads a live cluster's dashboard (tests/e2e/test_trace_record.py)",
    "make demo": "starts a local Ray cluster for minutes (tests/e2e/test_tune_sweep.py runs its sweep)",
    "make test": "the whole suite",
    "make wheel": "builds into dist/ (tests/packaging/test_wheel.py)",
    "make bench": "a benchmark (benches/)",
    "make karpenter": "builds Karpenter from the Go module proxy (benches/bench_vs_karpenter.py)",
    "source": "a shell built-in (activates the venv)",
    "python": "a driver for a running cluster (examples/, a `ray.init(address=...)` script)",
    "python3": "creates a venv and installs into it (what `make install` does)",
    ".venv/bin/python": "a benchmark (benches/) or a pytest run of the suite",
}

# Transcripts (`$ ...` in an untyped block) of files that are not in the repo: the file, and what it stands for.
SAMPLE_FILES = {
    "cluster.yaml": "troubleshooting.md's example of a YAML whose setup_commands is a string "
                    "(tests/config/test_ray_preparation.py plans each such shape)",
}

# Cluster YAMLs shown as fragments, not planned: (page, a line of the block) -> why.
FRAGMENTS = {
    ("docs/index.md", "exclude: {gpus: [M60, K80]}"):
        "the headline provider block and node types only; tests/config/test_typos_and_families.py plans it with "
        "its missing keys and checks they are all named in one error",
}


def _blocks(page: Path) -> list[tuple[str, str]]:
    """(info string, body) of each fenced block, in order."""
    return [(m.group(1), m.group(2)) for m in re.finditer(r"^```(\w*)\n(.*?)^```", page.read_text(), re.S | re.M)]


def _commands(body: str) -> list[str]:
    """A bash block's commands: continuation lines joined, comment lines dropped, a quoted argument that spans
    lines (a `python -c '...'` script) kept in one command."""
    out, pending = [], ""
    for line in body.replace("\\\n", " ").splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending = pending + "\n" + line if pending else line
        try:
            shlex.split(pending, comments=True)
        except ValueError:          # an open quote: the command goes on on the next line
            continue
        out.append(pending)
        pending = ""
    assert not pending, pending
    return out


def _kind(argv: list[str]) -> str:
    words = [w for w in argv if not re.match(r"^[A-Z_][A-Z0-9_]*=", w)]    # env assignments before the program
    program = words[0]
    if program == "ray-nodeless" and words[1] in ("catalog", "trace"):
        return " ".join(words[:3])
    if program in ("ray", "ray-nodeless", "make"):
        return " ".join(words[:2])
    return program


# Options whose value is a file the command writes: a relative one goes to the tmp dir too, not into the checkout.
OUTPUTS = {"-o", "--out", "--plot", "--ray-up", ">"}


def _run(argv: list[str], tmp: Path, monkeypatch: pytest.MonkeyPatch):
    """`ray-nodeless ...` from the repo root, /tmp paths and relative output files in `tmp`, `> FILE` as a
    redirect of stdout."""
    argv = [f"{tmp}/{a[5:]}" if a.startswith("/tmp/") and not a.startswith(f"{tmp}/") else a for a in argv]
    argv = [str(tmp / a) if i and argv[i - 1] in OUTPUTS and not Path(a).is_absolute() else a
            for i, a in enumerate(argv)]
    out_file = None
    if ">" in argv:
        i = argv.index(">")
        argv, out_file = argv[:i], argv[i + 1]
    monkeypatch.chdir(REPO_ROOT)
    r = CliRunner().invoke(main, argv[1:])
    if out_file:
        Path(out_file).write_text(r.stdout)
    return r


def _page_id(page: Path) -> str:
    return str(page.relative_to(REPO_ROOT))


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_command_of_the_page_runs_or_is_listed(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    unlisted = []
    for info, body in _blocks(page):
        if info != "bash":
            continue
        for command in _commands(body):
            argv = shlex.split(command, comments=True)
            kind = _kind(argv)
            if kind in RUN and argv[0] == "ray-nodeless":
                r = _run(argv, tmp_path, monkeypatch)
                want = 2 if "# exit 2" in command else 0
                assert r.exit_code == want, (command, r.output[-3000:])
                assert "Traceback" not in r.output, (command, r.output[-3000:])
            elif kind not in NOT_RUN:
                unlisted.append(f"{kind}: {command}")
    assert unlisted == [], "a command kind neither run nor listed in NOT_RUN"


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_transcript_of_the_page_runs(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for info, body in _blocks(page):
        if info:
            continue
        lines = body.splitlines()
        for i, line in enumerate(lines):
            if not line.startswith("$ "):
                continue
            argv = shlex.split(line[2:], comments=True)
            if argv[0] != "ray-nodeless":
                assert _kind(argv) in NOT_RUN, line
                continue
            files = [a for a in argv if a.endswith(".yaml")]
            if any(f in SAMPLE_FILES for f in files):
                continue
            if page.name == "README.md":
                continue                            # its YAML is README's own: test_readme_transcript_is_real
            r = _run(argv, tmp_path, monkeypatch)
            error = i + 1 < len(lines) and lines[i + 1].startswith("ray-nodeless: error:")
            assert r.exit_code == (2 if error else 0), (line, r.output[-3000:])


def _yaml_blocks(page: Path) -> list[tuple[str, dict]]:
    out = []
    for info, body in _blocks(page):
        if info == "yaml":
            doc = yaml.safe_load(body)
            if isinstance(doc, dict) and ({"provider", "available_node_types"} <= set(doc)
                                          or str(doc.get("apiVersion", "")).startswith("ray.io/")):
                out.append((body, doc))
    return out


@pytest.mark.parametrize("page", PAGES, ids=_page_id)
def test_every_cluster_yaml_of_the_page_plans(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    for n, (body, _) in enumerate(_yaml_blocks(page)):
        fragment = [why for (p, line), why in FRAGMENTS.items() if p == _page_id(page) and line in body]
        if fragment:
            continue
        path = tmp_path / f"block{n}.yaml"
        path.write_text(body)
        r = _run(["ray-nodeless", "plan", str(path)], tmp_path, monkeypatch)
        assert r.exit_code == 0, (body, r.output[-3000:])


def test_every_listed_fragment_is_still_in_its_page():
    for (page, line) in FRAGMENTS:
        assert any(line in body for body, _ in _yaml_blocks(REPO_ROOT / page)), (page, line)


def test_readme_transcript_is_the_plan_of_its_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """README's `$ ray-nodeless plan gpu-sweep.yaml`: each line it shows is a line of the real plan of README's
    YAML (it is cut to the decisions)."""
    readme = REPO_ROOT / "README.md"
    ((body, _),) = _yaml_blocks(readme)
    (shown,) = [b for info, b in _blocks(readme) if not info and b.startswith("$ ray-nodeless plan gpu-sweep.yaml")]
    path = tmp_path / "gpu-sweep.yaml"
    path.write_text(body)
    r = _run(["ray-nodeless", "plan", str(path)], tmp_path, monkeypatch)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    for line in shown.splitlines()[1:]:
        assert line in lines, (line, r.stdout)


def test_the_kinds_are_found():
    """Guards the extraction (the pages' commands are of every kind run here) and the lists (every kind listed
    as not run is still in some page: a list of kinds the docs no longer show would hide nothing, but mislead)."""
    kinds = {_kind(shlex.split(c, comments=True)) for page in PAGES for info, body in _blocks(page)
             if info == "bash" for c in _commands(body)}
    kinds |= {_kind(shlex.split(line[2:], comments=True)) for page in PAGES for info, body in _blocks(page)
              if not info for line in body.splitlines() if line.startswith("$ ")}
    assert RUN <= kinds, RUN - kinds
    assert set(NOT_RUN) <= kinds, set(NOT_RUN) - kinds
