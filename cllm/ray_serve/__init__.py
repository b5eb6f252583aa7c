"""cllm on Ray Serve (the `ray` extra): `serve run cllm.ray_serve:app_builder config=cllm.yaml`; see app.py."""

from cllm.ray_serve.app import app_builder, application, run

__all__ = ["app_builder", "application", "run"]
