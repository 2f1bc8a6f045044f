"""`harness info`: versions, the accelerators this machine has, and Ray's resources if asked."""

from __future__ import annotations

import argparse
import json
import platform
from importlib import metadata
from typing import Any

from harness import __version__

PACKAGES = (
    "torch",
    "torch-npu",
    "ray",
    "numpy",
    "gymnasium",
    "seals",
    "onnx",
    "onnxruntime",
    "onnx2torch",
    "pyarrow",
    "duckdb",
    "stable-baselines3",
)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser("info", help="versions, accelerators found, Ray resources")
    parser.add_argument("--json", action="store_true", help="print JSON")
    parser.add_argument("--address", help="also list the resources of this Ray cluster")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    print_info(args.json, args.address)
    return 0


def collect(address: str | None) -> dict[str, Any]:
    from harness.devices import describe_local

    versions: dict[str, str | None] = {"harness": __version__, "python": platform.python_version()}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    info: dict[str, Any] = {"versions": versions, "host": platform.node(), "devices": describe_local()}
    if address:
        info["ray"] = _ray_resources(address)
    return info


def _ray_resources(address: str) -> dict[str, Any]:
    import ray

    from harness.devices import SIMULATED
    from harness.cluster.place import connect

    connect(address, SIMULATED, None)  # joining `address`: what would start a local Ray is unused
    try:
        return {"resources": ray.cluster_resources(), "nodes": sum(1 for n in ray.nodes() if n.get("Alive"))}
    finally:
        ray.shutdown()


def print_info(as_json: bool, address: str | None) -> None:
    info = collect(address)
    if as_json:
        print(json.dumps(info, indent=2, default=str))
        return
    print(f"harness {__version__} on {info['host']}")
    for name, version in info["versions"].items():
        print(f"  {name:<18} {version or '-'}")
    # The precision and compile settings each card starts with are what the checklist in the
    # docs/clusters.md ("Before a sweep: on one Ascend node") reads before a sweep; --json has the same.
    devices = dict(info["devices"])
    auto = devices.pop("auto")
    for kind, d in devices.items():
        print_accelerator(kind, d)
    print(f"  {'auto picks':<18} {auto}")
    if "ray" in info:
        print(f"  {'ray cluster':<18} {info['ray']}")


def print_accelerator(kind: str, d: dict[str, Any]) -> None:
    """One accelerator of `describe_local`: available or why not, its cards, then what they run
    on and how a card computes (the checklist in docs/clusters.md reads these before a sweep)."""
    names = d.get("devices", [])
    if not d["available"]:
        print(f"  {kind:<18} no: {d['reason']}")
    elif d.get("simulated"):
        print(f"  {kind:<18} simulated cards on {', '.join(names)} ({d.get('cores', '?')} cores)")
    else:
        print(f"  {kind:<18} available: {len(names)} card(s): {', '.join(names)}")
    for key, value in {**d.get("runtime", {}), **d.get("settings", {})}.items():
        print(f"  {'':<18}   {key} = {value}")
    for warning in d.get("warnings", []):
        print(f"  {'':<18}   warning: {warning}")
