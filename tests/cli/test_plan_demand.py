"""`ray-nodeless plan` of demands (issue 17, "Preview"): the menu of a shape-open cluster, `--demand` with label
selectors, declared clusters, `--json`, and the errors, all through the `ray-nodeless` group itself.

The expected offerings are found here by brute force over the region's catalog with the docs' ranking (capacity
preference, then price, then type name, then zone) and the documented defaults (x86_64, no burstable types, no
non-GPU accelerators, no GPU instance for a GPU-less demand, unknown prices never chosen), independently of the
planner the command runs.
"""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml
from click.testing import CliRunner

from ray_nodeless.cli import main
from ray_nodeless.core.family_names import AWS_PREVIOUS_GENERATION
from ray_nodeless.core.catalog import embedded
from ray_nodeless.core.node_resources import instance_resources
from tests import REPO_ROOT

NODELESS = str(REPO_ROOT / "cluster-configs" / "local-nodeless.yaml")
CPU_HEAD = str(REPO_ROOT / "cluster-configs" / "local-cpu-head.yaml")
SPOT_FIRST = ("spot", "on-demand")          # local-nodeless.yaml's worker rule


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def brute_force(*, cpu: float = 0, gpu: int = 0, model: str = "", labels: dict | None = None,
                capacity: tuple[str, ...] = SPOT_FIRST, excluded_gpus: tuple[str, ...] = ("M60", "K80")):
    """The cheapest-fit offering of aws us-west-2 for a demand under local-nodeless.yaml's rules."""
    best = None
    for o in embedded().region("aws", "us-west-2").offerings():
        t = o.instance_type
        if (o.hourly_price is None or o.capacity not in capacity or t.arch != "x86_64" or t.burstable
                or t.accelerator or (gpu == 0 and t.gpu_count) or t.gpu_count < gpu
                or (model and t.gpu_model != model) or t.gpu_model in excluded_gpus
                or t.family in AWS_PREVIOUS_GENERATION):     # left out by default (allow_previous_generation)
            continue
        if instance_resources(t, {}).get("CPU", 0) < cpu:
            continue
        have = {"ray.io/market-type": o.capacity, "ray.io/availability-zone": o.zone}
        if any(have.get(k) not in v for k, v in (labels or {}).items()):
            continue
        key = (capacity.index(o.capacity), o.hourly_price, t.name, o.zone)
        if best is None or key < best[0]:
            best = (key, o)
    return best[1]


def menu_row(output: str, label: str) -> list[str]:
    (line,) = [ln for ln in output.splitlines() if ln.startswith(f"  {label}  ")]
    return line.split()[len(label.split()):]


# ----- the menu of a shape-open cluster -------------------------------------------------------------------------

def test_menu_of_a_shape_open_cluster_shows_cheapest_fits_and_what_is_forbidden():
    r = run("plan", NODELESS)
    assert r.exit_code == 0, r.output
    out = r.stdout
    assert out.index("[head] head:") < out.index("shape-open:") < out.index("idle cost:")
    for label, kw in [("CPU 1", dict(cpu=1)), ("CPU 16", dict(cpu=16)), ("CPU 64", dict(cpu=64)),
                      ("GPU 1", dict(gpu=1)), ("GPU 2", dict(gpu=2)), ("GPU 8", dict(gpu=8)),
                      ("GPU 1 L4", dict(gpu=1, model="L4")), ("GPU 1 T4", dict(gpu=1, model="T4")),
                      ("GPU 1 A10G", dict(gpu=1, model="A10G")),
                      ("CPU 4 on-demand", dict(cpu=4, capacity=("on-demand",))),
                      ("CPU 4 spot", dict(cpu=4, capacity=("spot",)))]:
        o = brute_force(**kw)
        node_type, itype, zone, market, hourly, rule = menu_row(out, label)
        assert (itype, zone, market, float(hourly), rule) == (
            o.instance_type.name, o.zone, o.capacity, round(o.hourly_price, 4), "spot-first"), label
        assert node_type == f"nl-{itype}-{zone}-{'spot' if market == 'spot' else 'od'}"
    for g in (16, 64, 256):
        assert menu_row(out, f"memory {g} GiB")       # a row each
    forbidden = out.split("forbidden:\n", 1)[1]
    # The config's own exclusion is named, with the region's fact.
    assert "  GPU 1 K80: provider.exclude.gpus excludes K80; accelerator_type:K80: no instance type in aws " \
           "us-west-2 has a K80 GPU" in forbidden
    # A model the region has only on Arm types: the planner's reason, with what would allow it.
    (t4g,) = [ln for ln in forbidden.splitlines() if ln.startswith("  GPU 1 T4G:")]
    assert "arch=" in t4g and "arm64" in t4g
    # A model the catalog has no price for is never chosen, and says so.
    (b200,) = [ln for ln in forbidden.splitlines() if ln.startswith("  GPU 1 B200:")]
    assert "unknown_price=" in b200


def test_menu_names_an_exclusion_of_a_model_the_region_has(tmp_path):
    cfg = yaml.safe_load(open(NODELESS))
    cfg["provider"]["exclude"]["gpus"] = ["M60", "K80", "T4"]
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = run("plan", str(path))
    assert r.exit_code == 0, r.output
    (t4,) = [ln for ln in r.stdout.splitlines() if ln.startswith("  GPU 1 T4:")]
    # The diagnosis lifted the exclusion and found what it would get without it.
    o = brute_force(gpu=1, model="T4", excluded_gpus=())
    assert t4.startswith("  GPU 1 T4: provider.exclude.gpus: leaves the demand")
    assert f"the nearest offering is {o.instance_type.name} " in t4
    assert not [ln for ln in r.stdout.splitlines() if ln.startswith("  GPU 1 T4  ")]


def test_menu_json():
    r = run("plan", NODELESS, "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["shape_open"] is True and doc["head_node_type"] == "head"
    rows = {m["demand"]: m for m in doc["menu"]}
    o = brute_force(gpu=2)
    assert (rows["GPU 2"]["fit"]["instance_type"], rows["GPU 2"]["fit"]["hourly_price"]) == (
        o.instance_type.name, o.hourly_price)
    assert rows["GPU 2"]["fit"]["labels"]["ray.io/accelerator-type"] == o.instance_type.gpu_model
    reasons = {f["demand"]: f["reason"] for f in doc["forbidden"]}
    assert reasons["GPU 1 K80"].startswith("provider.exclude.gpus excludes K80")


def test_a_declared_cluster_prints_as_before():
    r = run("plan", CPU_HEAD)
    assert r.exit_code == 0, r.output
    assert "shape-open" not in r.stdout and "forbidden" not in r.stdout
    assert "[workers 0..3] gpu_worker:" in r.stdout
    assert json.loads(run("plan", CPU_HEAD, "--json").stdout)["shape_open"] is False


# ----- one demand -----------------------------------------------------------------------------------------------

def test_demand_gets_its_cheapest_fit_with_labels_and_alternatives():
    r = run("plan", NODELESS, "--demand", '{"GPU": 2}')
    assert r.exit_code == 0, r.output
    o = brute_force(gpu=2)
    t = o.instance_type
    lines = r.stdout.splitlines()
    assert lines[0] == "demand {GPU: 2}"
    assert "the cluster is shape-open" in lines[1]
    assert lines[2] == (f"    node type nl-{t.name}-{o.zone}-spot: {t.name} ({t.vcpus:g} vCPU, {t.memory_gib:g} GiB, "
                        f"{t.gpu_count}x{t.gpu_model}) {o.zone} spot ${o.hourly_price:.4f}/h, rule 'spot-first'")
    assert lines[3] == (f"    labels (the node carries them): ray.io/accelerator-type={t.gpu_model}, "
                        f"ray.io/availability-region=us-west-2, ray.io/availability-zone={o.zone}, "
                        f"ray.io/market-type=spot")
    assert lines[4].startswith(f"    resources: CPU: {t.vcpus:g}, GPU: {t.gpu_count}, "
                               f"accelerator_type:{t.gpu_model}: 1")
    alts = [ln for ln in lines if ln.startswith("    alternative: ")]
    assert len(alts) == 3       # --alternatives defaults to 3
    # The next choices after a capacity error: never the chosen one again, never dearer before cheaper.
    assert all(f"{t.name} ({t.vcpus:g} vCPU" in a and f" {o.zone} " not in a for a in alts[:1])


def test_label_selector_fallbacks_in_order():
    r = run("plan", NODELESS, "--demand", '{"CPU": 2}',
            "--label-selector", '{"ray.io/availability-zone": "us-east-1a"}',
            "--label-selector", '{"ray.io/availability-zone": "in(us-west-2b,us-west-2c)", '
                                '"ray.io/market-type": "on-demand"}', "--alternatives", "1")
    assert r.exit_code == 0, r.output
    o = brute_force(cpu=2, capacity=("on-demand",),
                    labels={"ray.io/availability-zone": ("us-west-2b", "us-west-2c")})
    assert f"node type nl-{o.instance_type.name}-{o.zone}-od: " in r.stdout
    assert f"ray.io/availability-zone={o.zone}, ray.io/market-type=on-demand" in r.stdout
    assert "label selector 0 gets nothing: no offering of rule 'spot-first' has labels " \
           "ray.io/availability-zone in (us-east-1a)" in r.stdout
    assert "matches its fallback label selector 1: ray.io/availability-zone in (us-west-2b,us-west-2c) and " \
           "ray.io/market-type in (on-demand)" in r.stdout
    assert r.stdout.count("    alternative: ") == 1


def test_not_in_selector_and_json():
    r = run("plan", NODELESS, "--demand", '{"GPU": 1}', "--label-selector",
            '{"ray.io/accelerator-type": "!in(L4,T4)"}', "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["served"] is True and doc["shape_open"] is True and doc["declared"] == []
    fit = doc["fit"]
    assert fit["gpu_model"] not in ("L4", "T4") and fit["gpu_count"] >= 1
    assert fit["labels"]["ray.io/accelerator-type"] == fit["gpu_model"]
    assert fit["selector"] == "ray.io/accelerator-type !in (L4,T4)" and fit["fallback"] == 0
    assert [a["hourly_price"] for a in doc["alternatives"]] == sorted(a["hourly_price"] for a in doc["alternatives"])
    assert all(a["gpu_model"] not in ("L4", "T4") for a in doc["alternatives"])


def test_a_forbidden_demand_names_the_exclusion_and_exits_non_zero():
    r = run("plan", NODELESS, "--demand", '{"GPU": 1, "accelerator_type:K80": 0.001}')
    assert r.exit_code == 2
    assert "Traceback" not in r.output
    assert "nothing allowed can serve it: provider.exclude.gpus excludes K80" in r.stdout
    assert r.stderr.startswith("ray-nodeless: error: {GPU: 1, accelerator_type:K80: 0.001}: provider.exclude.gpus "
                               "excludes K80")


@pytest.mark.parametrize("demand,reason", [
    ('{"CPU": 1000}', "--demand.CPU: 1000 is more than any instance type in aws us-west-2 has"),
    ('{"custom": 1}', "no instance offers the resource(s) ['custom']; declare a node type with them"),
])
def test_a_demand_no_offering_can_hold(demand, reason):
    r = run("plan", NODELESS, "--demand", demand)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert reason in r.stdout and reason in r.stderr


def test_a_selector_no_offering_matches():
    r = run("plan", NODELESS, "--demand", '{"CPU": 1}', "--label-selector", '{"ray.io/market-type": "reserved"}')
    assert r.exit_code == 2
    assert "has labels ray.io/market-type in (reserved)" in r.stderr


@pytest.mark.parametrize("args,key", [
    (["--demand", "{GPU: 2}"], "--demand: is not JSON"),
    (["--demand", '{"GPU": -1}'], "--demand.GPU: must be a number >= 0"),
    (["--demand", "{}"], "--demand: asks for nothing"),
    (["--demand", '{"CPU": 1}', "--label-selector", '{"ray.io/market-type": 3}'],
     "--label-selector[0].ray.io/market-type: must be a string"),
    (["--label-selector", '{"ray.io/market-type": "spot"}'], "--label-selector: goes with --demand"),
])
def test_bad_demand_input_names_the_option(args, key):
    r = run("plan", NODELESS, *args)
    assert r.exit_code == 2, r.output
    assert r.stderr.startswith(f"ray-nodeless: error: {key}"), r.stderr


def test_demand_needs_a_cluster_yaml():
    r = run("plan", "--demand", '{"CPU": 1}')
    assert r.exit_code == 2
    assert "--demand: needs CLUSTER_YAML" in r.stderr


# ----- declared clusters ----------------------------------------------------------------------------------------

def test_declared_cluster_names_the_node_type_ray_launches():
    r = run("plan", CPU_HEAD, "--demand", '{"GPU": 1}')
    assert r.exit_code == 0, r.output
    assert "declared node type 'gpu_worker' holds it: Ray launches it" in r.stdout
    assert "resources: CPU: 4, GPU: 1; labels: none" in r.stdout
    # Its instance is the one `plan CLUSTER_YAML` shows for the node type.
    plain = run("plan", CPU_HEAD).stdout
    (worker,) = [ln for ln in plain.splitlines() if ln.startswith("[workers 0..3] gpu_worker:")]
    itype = worker.split("-> ")[1].split()[0]
    assert f"    instance: {itype} " in r.stdout
    assert "for comparison, its own cheapest fit" in r.stdout


def test_declared_cluster_without_a_fitting_type_says_what_shape_open_would_launch():
    r = run("plan", CPU_HEAD, "--demand", '{"GPU": 2}')
    assert r.exit_code == 2
    assert "no declared worker node type holds it; with provider.open_shapes: true" in r.stdout
    o = brute_force(gpu=2)
    assert f": {o.instance_type.name} (" in r.stdout
    assert "the cluster is not shape-open (provider.open_shapes): Ray reports it as infeasible" in r.stderr


def test_declared_types_ranked_as_rays_v2_scheduler_scores_them(tmp_path):
    """A 1-CPU task with a 4-CPU and a 4-CPU+1-GPU type: Ray avoids the GPU node; with a label selector the type
    whose labels match wins; labels that do not match take a type out."""
    cfg = yaml.safe_load(open(CPU_HEAD))
    cfg["available_node_types"]["cpu_worker"] = {"resources": {"CPU": 4}, "labels": {"team": "a"},
                                                 "node_config": {}, "max_workers": 2}
    cfg["available_node_types"]["big_cpu"] = {"resources": {"CPU": 16}, "node_config": {}, "max_workers": 2}
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = run("plan", str(path), "--demand", '{"CPU": 4}', "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    # GPU avoidance first, then utilisation: the 4-CPU type is full, the 16-CPU one a quarter used.
    assert [d["node_type"] for d in doc["declared"]] == ["cpu_worker", "big_cpu", "gpu_worker"]
    doc = json.loads(run("plan", str(path), "--demand", '{"CPU": 4}', "--label-selector", '{"team": "a"}',
                         "--json").stdout)
    assert [d["node_type"] for d in doc["declared"]] == ["cpu_worker"]
    doc = json.loads(run("plan", str(path), "--demand", '{"CPU": 4}', "--label-selector", '{"team": "!a"}',
                         "--json").stdout)
    assert [d["node_type"] for d in doc["declared"]] == ["big_cpu", "gpu_worker"]


def test_the_demand_preview_imports_no_ray():
    """`plan` must stay Ray-free (tests/cli/test_plan_imports.py); the demand path too, through the entry point."""
    code = ("import sys\nfrom ray_nodeless.cli import main\ntry:\n    main(sys.argv[1:])\nexcept SystemExit as e:\n"
            "    assert e.code == 0, e.code\nassert not [m for m in sys.modules if m == 'ray' or m.startswith('ray.')]")
    r = subprocess.run([sys.executable, "-c", code, "plan", CPU_HEAD, "--demand", '{"GPU": 1}'], cwd=REPO_ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "declared node type 'gpu_worker'" in r.stdout


# ----- the docs' commands, as written (docs/shape-open.md) ------------------------------------------------------------

def _docs_section() -> str:
    text = (REPO_ROOT / "docs" / "shape-open.md").read_text()
    return text.split("## Preview a demand\n", 1)[1].split("\n#", 1)[0]


def test_docs_preview_commands_run_as_written():
    import shlex

    blocks = _docs_section().split("```")
    commands = blocks[1].removeprefix("bash\n").replace("\\\n", " ").strip().splitlines()
    assert len(commands) == 6
    for line in commands:
        argv = shlex.split(line, comments=True)
        assert argv[0] == "ray-nodeless"
        r = run(*argv[1:])
        assert r.exit_code == (2 if "# exit 2" in line else 0), (line, r.output)
        assert "Traceback" not in r.output
    # The sample output is the real output of the third command.
    sample = blocks[3].strip("\n")
    argv = shlex.split(commands[2], comments=True)
    assert run(*argv[1:]).stdout.rstrip("\n") == sample


def test_max_hourly_cost_refuses_what_the_launcher_would(tmp_path):
    """A fit that would take the cluster (the head alone) over provider.max_hourly_cost is one the launcher refuses:
    the preview says so and exits 2; the menu lists such rows as forbidden."""
    cfg = yaml.safe_load(open(NODELESS))
    cfg["provider"]["max_hourly_cost"] = 1.0
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(cfg))
    r = run("plan", str(path), "--demand", '{"GPU": 8}')
    assert r.exit_code == 2, r.output
    assert "over budget: with the head ($0.0565/h) it takes the cluster to $" in r.stdout
    assert "over provider.max_hourly_cost = $1.0000/h: the launch is refused" in r.stderr
    assert run("plan", str(path), "--demand", '{"GPU": 1}').exit_code == 0
    menu = run("plan", str(path)).stdout
    (gpu8,) = [ln for ln in menu.splitlines() if ln.startswith("  GPU 8:")]
    assert "over provider.max_hourly_cost = $1.0000/h" in gpu8
    # After the head's lines, the shape-open header states the cap.
    (header,) = [ln for ln in menu.splitlines() if ln.startswith("shape-open:")]
    assert "max_hourly_cost $1.0000/h" in header, menu


@pytest.mark.parametrize("ray_spelling, canonical", [
    ('{"num_cpus": 2}', '{"CPU": 2}'),
    ('{"num_gpus": 1, "accelerator_type": "L4"}', '{"GPU": 1, "accelerator_type:L4": 0.001}'),
    ('{"CPU": 1, "memory": "64Gi"}', '{"CPU": 1, "memory": 68719476736}'),
    ('{"CPU": 1, "memory": "64G"}', '{"CPU": 1, "memory": 64000000000}'),
])
def test_demand_takes_rays_task_option_spellings(ray_spelling, canonical):
    a, b = run("plan", NODELESS, "--demand", ray_spelling), run("plan", NODELESS, "--demand", canonical)
    assert a.exit_code == 0 and a.stdout == b.stdout, a.output


@pytest.mark.parametrize("text, words", [
    ('{"cpu": 4}', "write 'CPU' (or num_cpus), not 'cpu'"),
    ('{"CPU": 1, "memory": "lots"}', "like '64Gi', '64GiB' or '64G'"),
    ('{"num_cpus": 1, "CPU": 2}', "CPU is given twice"),
])
def test_a_demand_in_another_spelling_names_the_right_form(text, words):
    r = run("plan", NODELESS, "--demand", text)
    assert r.exit_code == 2 and words in r.stderr, r.output


@pytest.mark.parametrize("text", ['"64Gi"', "64Gi", "[4]", "CPU=4"])
def test_a_demand_that_is_not_a_json_object_is_shown_the_right_form(text):
    r = run("plan", NODELESS, "--demand", text)
    assert r.exit_code == 2 and "a JSON object of Ray's resources, e.g. '{" in r.output, r.output
    example = r.output.split("e.g. '", 1)[1].split("'", 1)[0]
    ok = run("plan", NODELESS, "--demand", example)            # the form it shows is one that plans
    assert ok.exit_code == 0 and "accelerator_type:L4" in ok.output, ok.output
