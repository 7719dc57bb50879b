"""The scale subresource against the real API server: `kubectl scale ltj` sets
``replicas.max`` (the nodes the job runs when it can have them), reads back the ready
count and the worker selector, and a count below ``replicas.min``, or one the global
batch does not split over, is refused by the spec's rules, naming them."""

from __future__ import annotations

import json

import pytest
import yaml
from support.chart import apply_crd
from support.specs import load_job

pytestmark = pytest.mark.cluster

NS = "scale-check"


def test_kubectl_scale_sets_replicas_max_and_a_count_below_min_is_refused(local_cluster):
    bed = local_cluster
    apply_crd(bed)
    bed.kubectl("create", "namespace", NS, check=False)
    job = load_job()
    job["metadata"] = {"name": "scaled"}
    job["spec"]["replicas"] = {"min": 2, "max": 2}
    # 24 samples split evenly over 2, 3 and 4 nodes (micro-batch 2, one rank a node), not 5.
    job["spec"]["procsPerNode"] = 1
    job["spec"]["trainer"]["builtin"].update(globalBatchSize=24, microBatchSize=2)
    job["spec"]["suspend"] = True  # no operator runs in this suite: nothing else writes
    bed.kubectl("apply", "-n", NS, "-f", "-", input=yaml.safe_dump(job))

    scaled = bed.kubectl("scale", "ltj", "scaled", "-n", NS, "--replicas=4", check=False)
    assert scaled.returncode == 0, scaled.stderr
    spec = json.loads(bed.kubectl("get", "ltj", "scaled", "-n", NS, "-o", "json").stdout)["spec"]
    assert spec["replicas"] == {"min": 2, "max": 4}, spec["replicas"]
    scale = json.loads(bed.kubectl("get", "--raw", f"/apis/llmtrain.io/v1alpha1/namespaces/{NS}/llmtrainjobs/scaled/scale").stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 4, scale

    refused = bed.kubectl("scale", "ltj", "scaled", "-n", NS, "--replicas=1", check=False)
    assert refused.returncode != 0 and "replicas.min must be <= replicas.max" in refused.stderr, refused.stderr
    # Every rule of the spec holds for a scale too: 24 samples do not split over 5 nodes.
    uneven = bed.kubectl("scale", "ltj", "scaled", "-n", NS, "--replicas=5", check=False)
    assert uneven.returncode != 0 and "globalBatchSize must be divisible" in uneven.stderr, uneven.stderr
    bed.kubectl("delete", "ltj", "scaled", "-n", NS)
