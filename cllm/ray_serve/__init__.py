"""cllm on Ray Serve (the `ray` extra): `serve run cllm.ray_serve:app_builder config=cllm.yaml`; see app.py.

The names come from app.py on first use, so that call.py (what the ingress routes by) imports without Ray.
"""

__all__ = ["app_builder", "application", "run"]


def __getattr__(name: str):
    if name in __all__:
        from cllm.ray_serve import app

        return getattr(app, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
