"""The KubeRay RayJob manifests (k8s/) against KubeRay's own RayJob CRD, as the Kubernetes API
server would take them with strict field validation (`kubectl apply --validate=strict`): every
field known to the schema, of its type, the required ones there. And what no schema can say: the
entrypoint parses as the sweep's own options, each worker's Ray resource counts the cards its
pod asks the device plugin for, and the driver's node mounts the results.

The CRD is KubeRay's, beside the checkout (../shared/k8s, never copied here): a clone alone skips
these tests with the reason; CI has it (HARNESS_REQUIRE_CASES=1 makes its absence a failure).
"""

from __future__ import annotations

import copy
import json
import os
import shlex
from typing import Any

import jsonschema
import pytest
import yaml

from jobs.sweep import parser
from tests.helpers import REPO

CRD = REPO.parent / "shared" / "k8s" / "ray.io_rayjobs.yaml"
MANIFESTS = {"npu": REPO / "k8s" / "rayjob-sweep.yaml", "cuda": REPO / "k8s" / "rayjob-sweep-cuda.yaml"}
# Per accelerator: the device plugin's resource a worker pod asks for, and the Ray resource its
# rayStartParams must declare in the same count.
CARDS = {"npu": ("huawei.com/Ascend910", "NPU"), "cuda": ("nvidia.com/gpu", "GPU")}
Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused where it lists an object's fields: what the API
    server's strict field validation does (a structural schema prunes them silently otherwise),
    except where the schema keeps unknown fields on purpose."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and "additionalProperties" not in schema:
            if not schema.get("x-kubernetes-preserve-unknown-fields"):
                schema["additionalProperties"] = False
        return schema
    if isinstance(schema, list):
        return [strict(item) for item in schema]
    return schema


@pytest.fixture(scope="module")
def rayjob_schema() -> dict[str, Any]:
    if not CRD.is_file():
        absent = f"KubeRay's RayJob CRD is absent beside the checkout ({CRD}); CI has it"
        if os.environ.get("HARNESS_REQUIRE_CASES") == "1":
            pytest.fail(f"{absent}, but HARNESS_REQUIRE_CASES=1 says it must be there")
        pytest.skip(absent)
    crd = yaml.load(CRD.read_text(), Loader=Loader)
    [served] = [v for v in crd["spec"]["versions"] if v["name"] == "v1"]
    return strict(served["schema"]["openAPIV3Schema"])


def manifest(accelerator: str) -> dict[str, Any]:
    loaded = yaml.safe_load(MANIFESTS[accelerator].read_text())
    assert isinstance(loaded, dict)
    return loaded


def problems(schema: dict[str, Any], job: dict[str, Any]) -> list[str]:
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(job)]


def card_counts(job: dict[str, Any], accelerator: str) -> list[tuple[int, int, int]]:
    """Per worker group: the cards its pods ask for (requests, limits) and Ray's count of them."""
    plugin, ray_resource = CARDS[accelerator]
    counts = []
    for group in job["spec"]["rayClusterSpec"]["workerGroupSpecs"]:
        [container] = group["template"]["spec"]["containers"]
        asked = container["resources"]
        params = group["rayStartParams"]
        if ray_resource == "GPU":
            declared = int(params["num-gpus"])
        else:
            declared = int(json.loads(json.loads(params["resources"]))[ray_resource])
        counts.append((int(asked["requests"][plugin]), int(asked["limits"][plugin]), declared))
    return counts


def entrypoint_args(job: dict[str, Any]) -> list[str]:
    python, script, *args = shlex.split(job["spec"]["entrypoint"])
    assert python == "python" and script.endswith("jobs/sweep.py"), job["spec"]["entrypoint"]
    return args


@pytest.mark.parametrize("accelerator", list(MANIFESTS))
def test_each_manifest_is_a_rayjob_the_crd_takes(accelerator: str, rayjob_schema: dict[str, Any]) -> None:
    job = manifest(accelerator)
    assert (job["apiVersion"], job["kind"]) == ("ray.io/v1", "RayJob")
    assert problems(rayjob_schema, job) == []
    spec = job["spec"]
    assert spec["shutdownAfterJobFinishes"] is True
    assert spec["activeDeadlineSeconds"] > 0 and spec["backoffLimit"] == 0


@pytest.mark.parametrize("accelerator", list(MANIFESTS))
def test_the_entrypoint_is_the_sweep_on_that_accelerator_into_the_volume(accelerator: str) -> None:
    job = manifest(accelerator)
    args = parser().parse_args(entrypoint_args(job))
    assert args.accelerator == accelerator
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]
    mounts = {m["mountPath"]: m["name"] for c in head["containers"] for m in c.get("volumeMounts", [])}
    volumes = {v["name"]: v for v in head["volumes"]}
    assert mounts[args.results] in volumes and "persistentVolumeClaim" in volumes[mounts[args.results]]


@pytest.mark.parametrize("accelerator", list(MANIFESTS))
def test_ray_counts_the_cards_each_worker_pod_asks_for(accelerator: str) -> None:
    counts = card_counts(manifest(accelerator), accelerator)
    assert counts and all(requests == limits == declared > 0 for requests, limits, declared in counts), counts


# Faults: each must fail the check above that guards against it.


@pytest.mark.parametrize(
    "fault",
    [
        ("a misspelt field", lambda spec: spec.update(shutdownAfterJobFinish=spec.pop("shutdownAfterJobFinishes"))),
        ("a count as a word", lambda spec: spec.update(backoffLimit="none")),
        ("no worker template", lambda spec: spec["rayClusterSpec"]["workerGroupSpecs"][0].pop("template")),
        (
            "an unknown container field",
            lambda spec: spec["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0].update(imag="x"),
        ),
    ],
    ids=lambda fault: fault[0],
)
def test_the_crd_refuses_a_broken_manifest(fault: tuple[str, Any], rayjob_schema: dict[str, Any]) -> None:
    job = copy.deepcopy(manifest("npu"))
    fault[1](job["spec"])
    assert problems(rayjob_schema, job), f"{fault[0]} passed the schema"


def test_a_card_count_that_differs_from_rays_is_seen() -> None:
    job = copy.deepcopy(manifest("npu"))
    [container] = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]["template"]["spec"]["containers"]
    container["resources"]["limits"]["huawei.com/Ascend910"] = "4"
    container["resources"]["requests"]["huawei.com/Ascend910"] = "4"
    assert any(not (requests == limits == declared) for requests, limits, declared in card_counts(job, "npu"))


def test_an_entrypoint_with_an_option_the_sweep_lacks_is_refused() -> None:
    job = copy.deepcopy(manifest("npu"))
    job["spec"]["entrypoint"] += " --cores 3"
    with pytest.raises(SystemExit) as exited:
        parser().parse_args(entrypoint_args(job))
    assert exited.value.code == 2
