"""One process of a two-process JAX trainer publishing weights (run as a script).

usage: _publication_worker.py ENGINE_URL DIRECTORY --processes 2 --process-id I --port PORT

Builds the tiny policy, shards its embedding across the two processes' devices by rows,
and calls `Publication.load` twice on every process: version 1 to a healthy replica, then
version 2 after the test has made the replica refuse its cache reset. Prints one JSON line
per attempt: {"process", "version", "ok", "error"}.
"""

from __future__ import annotations

import argparse
import json
import os

from dew.testing.processes import join_cpu, process_arguments

os.environ.setdefault("JAX_PLATFORMS", "cpu")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("directory")
    args = process_arguments(p).parse_args()
    process, url, directory = args.process_id, args.url, args.directory
    join_cpu(1, args.processes, args.process_id, args.port)
    import httpx
    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec
    from rollout_engine import tiny_pretrained

    from dew.rollout import Publication, PushFailed, SafetensorsReload

    policy = tiny_pretrained(seed=9)
    mesh = Mesh(np.asarray(jax.devices()), ("rows",))
    table = np.asarray(policy.variables["params"]["embed_tokens"]["embedding"])
    half = table.shape[0] // 2
    local = table[process * half : (process + 1) * half]
    sharded = jax.make_array_from_process_local_data(
        NamedSharding(mesh, PartitionSpec("rows")), local, table.shape
    )
    assert not sharded.is_fully_addressable
    params = dict(policy.variables["params"])
    params["embed_tokens"] = {"embedding": sharded}
    publication = Publication(SafetensorsReload(policy, directory, [url], timeout=30), version=0)
    for version in (1, 2):
        if version == 2:
            # wait until the test has armed the fault, then try again
            httpx.post(f"{url}/arm", timeout=30)
        try:
            publication.load({"params": params}, version)
            outcome = {"ok": True, "error": ""}
        except PushFailed as error:
            outcome = {"ok": False, "error": str(error)}
        outcome.update(process=process, version=publication.version)
        print(json.dumps(outcome), flush=True)


if __name__ == "__main__":
    main()
