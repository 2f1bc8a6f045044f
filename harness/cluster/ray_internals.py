"""The harness's only uses of Ray's private modules (`ray._private`, `ray._common`,
`ray.autoscaler._private`, `ray.core.generated`, `ActorHandle._actor_id`), each one without a
public equivalent. Checked on Ray 2.40.0 and 2.60.0, the ends of the range pyproject.toml
declares (`make test-ray-2.40.0` and `make test`); tests/test_ray_internals.py refuses them
anywhere else.

- `actor_state`: an actor's state and restart count from the GCS actor table.
  `ray.util.state.get_actor` asks the dashboard's state API, which a private local Ray (started
  without a dashboard) and a cluster whose owners run none do not serve, and an actor handle has
  no public id.
- `ask_gcs`: one question to a cluster's GCS before joining it, with the credentials ray.init
  will send, so that a token the cluster refuses fails in seconds, named; ray.init retries for
  20 s and more, then names neither. Ray has no public call that reaches a GCS without joining.
  Ray 2.40 keeps `init_grpc_channel` in `ray._private.utils` (later in `ray._private.grpc_utils`).
- `ray_address_file`: where `ray start --head` writes the address a plain ray.init joins (tests).
  Ray moved `get_ray_address_file` from `ray._private.utils` to `ray._common.utils` after 2.40.
- `validate_cluster_config`: what `ray up` checks of a cluster YAML first (tests); Ray validates
  one only in its autoscaler's private module.
- `drivers_join_the_head`: the raylet a driver started in this process joins (tests). A driver
  joins a raylet of its own machine; where several nodes of one cluster share a machine (a
  `ray.cluster_utils.Cluster`), Ray after 2.40 picks the head's, 2.40 any of them (by hash), and a
  test that kills that node kills the driver too. ray.init has no public way to choose.
- `job_alive`: whether a driver (a job) is still connected, from the GCS job table: the warm cards
  of `harness up` serve one sweep at a time and are free again once its driver is gone, however
  it ended. `ray.util.state.list_jobs` asks the dashboard, which a private local Ray runs none of.
- `AuthenticationError`: token authentication came after Ray 2.40; on a Ray without it, a class
  nothing raises, so that `except` clauses naming it stay valid.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import ray

# Ray before token authentication (2.40 has none) raises no AuthenticationError.
AuthenticationError: type[Exception] = getattr(ray.exceptions, "AuthenticationError", None) or type(
    "AuthenticationError", (Exception,), {}
)


def actor_state(actor: Any) -> tuple[str, int] | None:
    """Ray's state of `actor` (ALIVE, RESTARTING, PENDING_CREATION, DEAD, ...) and how often it
    restarted, from the GCS actor table; None where the GCS did not answer (a busy one times out)."""
    info = ray._private.state.actors(actor_id=actor._actor_id.hex())
    return (str(info["State"]), int(info.get("NumRestarts", 0))) if info else None


def job_alive(job_id: str) -> bool:
    """Whether the job (driver) of hex id `job_id` is still connected to the cluster."""
    return any(job["JobID"] == job_id and not job["IsDead"] for job in ray._private.state.jobs())


def ask_gcs(address: str, timeout_s: float) -> None:
    """Ask the GCS at `address` for its cluster id, with this client's credentials; raises what
    Ray or grpc raise (an AuthenticationError, a grpc.RpcError with its status code)."""
    try:
        from ray._private.grpc_utils import init_grpc_channel
    except ImportError:  # Ray 2.40: in ray._private.utils, and no tokens to send
        from ray._private.utils import init_grpc_channel
    from ray.core.generated import gcs_service_pb2, gcs_service_pb2_grpc

    with init_grpc_channel(address) as channel:
        stub = gcs_service_pb2_grpc.NodeInfoGcsServiceStub(channel)
        stub.GetClusterId(gcs_service_pb2.GetClusterIdRequest(), timeout=timeout_s)


def ray_address_file() -> str:
    """The file in which `ray start --head` leaves its address for a plain ray.init to join."""
    try:
        from ray._common.utils import get_ray_address_file
    except ImportError:  # Ray 2.40
        from ray._private.utils import get_ray_address_file
    return str(get_ray_address_file(None))


def validate_cluster_config(config: dict[str, Any]) -> None:
    """Raise where `config` (a cluster YAML, loaded) is not one `ray up` accepts."""
    from ray.autoscaler._private.util import prepare_config, validate_config

    validate_config(prepare_config(config))


@contextmanager
def drivers_join_the_head(cluster: Any) -> Iterator[None]:
    """While open, a driver this process starts (ray.init with an address) joins the raylet of the
    head of `cluster` (a `ray.cluster_utils.Cluster`, every node on this machine). Ray 2.40's
    `get_node_to_connect_for_driver(gcs_address, node_ip_address)` is replaced by the head's node;
    later Ray's (gcs_client, node_ip_address, node_name, ...) prefers the head itself."""
    import ray._private.services as services

    original = services.get_node_to_connect_for_driver
    if next(iter(inspect.signature(original).parameters)) != "gcs_address":
        yield
        return
    head = cluster.head_node.node_id
    services.get_node_to_connect_for_driver = lambda gcs_address, _ip: services.get_node(gcs_address, head)
    try:
        yield
    finally:
        services.get_node_to_connect_for_driver = original
