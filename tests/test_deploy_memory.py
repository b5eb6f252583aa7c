"""The Kubernetes Deployment's memory request against the embedded model (the manifests alone:
tests/unit/test_deploy.py)."""

from __future__ import annotations

import os
import re

import yaml

from cllm.core.config_load import load_config
from cllm.core.model_file import resolve_model
from cllm.core.model_meta import gpu_layers, kv_cache_bytes
from frontend_proc.core.tokenizer import Tokenizer
from tests.conftest import ROOT

UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30}


def test_the_memory_request_covers_the_model_its_kv_cache_and_the_processes():
    with open(os.path.join(ROOT, "deploy", "k8s", "deployment.yaml")) as f:
        (container,) = yaml.safe_load(f)["spec"]["template"]["spec"]["containers"]
    args = container["args"]
    config = load_config(None, {"parallel": int(args[args.index("--parallel") + 1])})
    path = resolve_model(config.model)
    cells = config.kv_cells(gpu_layers(config) > 0)
    kv = kv_cache_bytes(Tokenizer(path).model, cells, config.cache_type_k, config.cache_type_v)
    number, unit = re.fullmatch(r"(\d+)(\w+)", container["resources"]["requests"]["memory"]).groups()
    assert int(number) * UNITS[unit] >= os.path.getsize(path) + kv + (300 << 20)
