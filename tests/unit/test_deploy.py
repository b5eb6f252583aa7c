"""The deployment files: Kubernetes manifests (validated offline), the systemd unit and its installer, the Dockerfile.

Whether the manifest's memory request fits the embedded model: tests/test_deploy_memory.py.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import ROOT

K8S = os.path.join(ROOT, "deploy", "k8s")
UNIT = os.path.join(ROOT, "deploy", "systemd", "cllm.service")
KUBERNETES = "1.30"


def read(path: str) -> str:
    with open(path) as f:
        return f.read()


def manifests() -> dict[str, dict]:
    docs = {}
    for path in sorted(glob.glob(os.path.join(K8S, "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                docs[doc["kind"]] = doc
    return docs


def test_kubernetes_manifests_validate_against_the_schemas():
    kv = pytest.importorskip("kubernetes_validate")
    docs = manifests()
    assert {"Deployment", "Service", "Secret", "HorizontalPodAutoscaler", "ServiceMonitor", "Kustomization"} <= set(
        docs
    )
    for kind, doc in docs.items():
        if kind in ("ServiceMonitor", "Kustomization"):  # not Kubernetes' own kinds: no schema bundled
            continue
        kv.validate(doc, KUBERNETES, strict=True)  # raises on any unknown or ill-typed field
    listed = yaml.safe_load(read(os.path.join(K8S, "kustomization.yaml")))["resources"]
    assert sorted(listed) == sorted(
        os.path.basename(p) for p in glob.glob(os.path.join(K8S, "*.yaml")) if "kustomization" not in p
    )


def test_the_deployment_probes_health_and_takes_its_key_from_the_secret():
    docs = manifests()
    pod = docs["Deployment"]["spec"]["template"]
    (container,) = pod["spec"]["containers"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"]["path"] == "/health"
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "model loading is tolerated"
    (key,) = [e for e in container["env"] if e["name"] == "CLLM_API_KEY"]
    assert key["valueFrom"]["secretKeyRef"]["name"] == docs["Secret"]["metadata"]["name"]
    assert docs["Service"]["spec"]["selector"].items() <= pod["metadata"]["labels"].items()
    assert docs["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]["name"] == docs["Deployment"]["metadata"]["name"]
    assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze is not installed")
def test_the_systemd_unit_verifies(tmp_path):
    # verify wants ExecStart's program to exist: point it at this checkout's cllm.
    unit = tmp_path / "cllm.service"
    cllm = shutil.which("cllm") or os.path.join(os.path.dirname(os.sys.executable), "cllm")
    unit.write_text(read(UNIT).replace("/opt/cllm/bin/cllm", cllm))
    run = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    complaints = [line for line in run.stderr.splitlines() if "cllm.service" in line]
    assert run.returncode == 0 and not complaints, run.stderr
    text = read(UNIT)
    for line in ("Restart=on-failure", "User=cllm", "EnvironmentFile=/etc/cllm/cllm.env"):
        assert line in text


def test_the_installer_writes_the_unit_a_private_key_and_a_config(tmp_path):
    run = subprocess.run(
        [os.path.join(ROOT, "scripts", "install-systemd.sh"), "--no-start"],
        env={**os.environ, "DESTDIR": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 0, run.stderr
    env = tmp_path / "etc" / "cllm" / "cllm.env"
    assert re.fullmatch(r"CLLM_API_KEY=\S{32,}\n", env.read_text())
    assert env.stat().st_mode & 0o777 == 0o640
    assert (tmp_path / "etc" / "systemd" / "system" / "cllm.service").read_text() == read(UNIT)
    from cllm.core.config_load import load_config

    assert load_config(str(tmp_path / "etc" / "cllm" / "cllm.yaml"), {}).port == 8080
    key = env.read_text()  # a second run keeps the key and the settings
    assert (
        subprocess.run(
            [os.path.join(ROOT, "scripts", "install-systemd.sh"), "--no-start"],
            env={**os.environ, "DESTDIR": str(tmp_path)},
            timeout=60,
        ).returncode
        == 0
    )
    assert env.read_text() == key


def test_the_dockerfile_builds_in_two_stages_and_runs_as_a_user_with_a_health_check():
    text = read(os.path.join(ROOT, "Dockerfile"))
    assert len(re.findall(r"^FROM ", text, re.M)) == 2 and "COPY --from=build" in text
    assert re.search(r"^USER (?!root)\w+", text, re.M)
    assert (
        re.search(r"^HEALTHCHECK .*\n.*CLLM_HEALTH_URL", text, re.M)
        and "CLLM_HEALTH_URL=http://127.0.0.1:8080/health" in text
    )
    assert "ARG CMAKE_ARGS" in text and '"--host", "0.0.0.0"' in text
