"""The converted YAML keeps the user's comments where its text still applies (PyYAML only), and always loads to
exactly the converted document."""
from __future__ import annotations

import copy

import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_nodeless.swapin.yaml_text import render

SOURCE = """\
# my cluster
cluster_name: demo   # inline

provider:
    type: aws        # the cloud
    region: us-west-2
    # zones we like
    availability_zone: us-west-2a
    cache_stopped_nodes: True

available_node_types:
    head:
        resources: {}
        node_config:
            InstanceType: m5.large   # pinned
            # the AMI
            ImageId: ami-1
    # workers on spot
    worker:
        resources: {"CPU": 2}
        node_config:
            InstanceType: m5.large
            InstanceMarketOptions:
                MarketType: spot

setup_commands:
    - >-
      echo one
      two

    # a comment between items
    - |
      line
      # not a comment: part of the block scalar
head_node_type: head
# trailing comment
"""


def test_unchanged_and_changed_keys_keep_their_comments() -> None:
    new = yaml.safe_load(SOURCE)
    new["provider"] = {"type": "external", "module": "m", "cloud": "aws", "region": "us-west-2",
                       "availability_zone": "us-west-2a"}
    new["available_node_types"]["worker"]["node_config"]["ImageId"] = "ami-2"
    new["max_workers"] = 2
    notes = {("provider", "cache_stopped_nodes"): ["cache_stopped_nodes: dropped"],
             ("available_node_types", "worker", "node_config", "ImageId"): ["ImageId: filled"]}
    text, kept = render(new, SOURCE, None, notes, ["header"])
    assert kept and yaml.safe_load(text) == new
    for comment in ("# my cluster", "# inline", "# zones we like", "# pinned", "# the AMI", "# workers on spot",
                    "# a comment between items", "# not a comment: part of the block scalar",
                    "# trailing comment", "# cache_stopped_nodes: dropped", "# ImageId: filled", "# header"):
        assert comment in text, comment
    assert "# the cloud" not in text             # its line changed (type: aws -> external)
    lines = text.splitlines()
    assert lines.index("            # ImageId: filled") + 1 == lines.index("            ImageId: ami-2")


def test_defaults_source_supplies_missing_keys_with_their_comments() -> None:
    defaults = "# How many\nmax_workers: 2\n\n# The commands\nsetup_commands: []\n"
    new = {"cluster_name": "x", "max_workers": 2, "setup_commands": ["a"]}
    text, kept = render(new, "cluster_name: x  # mine\n", defaults)
    assert kept and yaml.safe_load(text) == new
    assert "# mine" in text and "# How many" in text and "# The commands" in text


def test_layouts_it_cannot_copy_fall_back_to_a_fresh_dump() -> None:
    src = "base: &b {x: 1}\nother: *b\nthird:\n  <<: *b\n  y: 2\n"
    new = copy.deepcopy(yaml.safe_load(src))
    new["third"]["y"] = 3
    text, kept = render(new, src)
    assert yaml.safe_load(text) == new
    text, kept = render({"a": 1}, "- not a mapping\n")
    assert not kept and yaml.safe_load(text) == {"a": 1}


values = st.recursive(
    st.one_of(st.integers(-5, 5), st.booleans(), st.none(), st.text("ab #:-\n'\"", max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3),
                            st.dictionaries(st.sampled_from(["k", "m", "n", "p"]), inner, max_size=3)),
    max_leaves=8)


@settings(max_examples=200, deadline=None)
@given(old=st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), values, min_size=1, max_size=4),
       new=st.dictionaries(st.sampled_from(["a", "b", "c", "e"]), values, min_size=1, max_size=4))
def test_output_always_loads_to_the_new_document(old: dict, new: dict) -> None:
    src = "# head\n" + yaml.safe_dump(old, default_flow_style=False, sort_keys=False)
    text, _ = render(new, src, None, {("a",): ["note"]}, ["h"])
    assert yaml.safe_load(text) == new
